"""What actually ran: the attention kernel SDPA picks for the point's shapes, and whether compile recompiled.

A silent fall-back of `scaled_dot_product_attention` to the math kernel makes a long-sequence
point slow and memory-hungry (a T×T matrix per head), so the worker forbids it on CUDA (a point
whose shapes no fused kernel takes then fails loudly) and records the kernel that did run: the aten
operator the first warm-up training step dispatched its attention to.
torch and the standard library only.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch

KERNELS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_efficient_attention": "efficient",
}
"""aten operator -> kernel name."""
MATH, MATH_OP = "math", "_scaled_dot_product_attention_math"


def forbid_math_attention() -> None:
    """On CUDA: no SDPA fall-back to the math kernel (it raises instead)."""
    torch.backends.cuda.enable_math_sdp(False)


class AttentionWatch:
    """Names the SDPA kernel that ran inside it, from the operator events of torch's profiler (CPU side only;
    the legacy RecordFunction profiler, which costs milliseconds to start, not Kineto's seconds). It sees
    eager and compiled steps alike, since it does not change what dispatches where. `kernel` is None when no
    attention ran."""

    def __init__(self) -> None:
        self.kernel: Optional[str] = None
        self._prof = torch.autograd.profiler.profile(use_kineto=False)

    def __enter__(self) -> AttentionWatch:
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[1] is not None:
            # The step failed (a collective that timed out waiting for a hung peer, say): its error goes to the log
            # first, since stopping the profiler after an operator that never finished has aborted the process
            # (heap corruption, SIGABRT) before the rank could write its error file; the launch then reads the error
            # from the log (scaling.launch.torchrun.classify). No kernel is named.
            print(f"{type(exc[1]).__name__}: {exc[1]}".splitlines()[0][:500], file=sys.stderr, flush=True)
        self._prof.__exit__(*exc)
        if exc[1] is not None:
            return
        # The operator names straight from the profiler's raw events: `function_events` would build and nest an
        # event object for each of the step's thousands of operators first, 0.3-0.8 s of a CPU rank's warm-up.
        ops = [e.name().removeprefix("aten::") for e in self._prof.kineto_results.events()]
        fused = next((KERNELS[op] for op in ops if op in KERNELS), None)
        self.kernel = fused or (MATH if any(op.startswith(MATH_OP) for op in ops) else None)


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (0 when the compiler was never used)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
