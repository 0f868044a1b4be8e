"""What actually ran: the attention kernel SDPA picks for the point's shapes, and whether compile recompiled.

A silent fall-back of `scaled_dot_product_attention` to the math kernel makes a long-sequence
point slow and memory-hungry (a T×T matrix per head), so the worker forbids it on CUDA (a point
whose shapes no fused kernel takes then fails loudly) and records the kernel that did run, found by
watching which aten operator one attention call of the point's shapes dispatches to.
torch and the standard library only.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

KERNELS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_efficient_attention": "efficient",
}
"""aten operator -> kernel name; an attention call that dispatches to none of them ran the math kernel."""
MATH = "math"


class _Dispatched(TorchDispatchMode):
    """Records the name of every aten operator dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def forbid_math_attention() -> None:
    """On CUDA: no SDPA fall-back to the math kernel (it raises instead)."""
    torch.backends.cuda.enable_math_sdp(False)


def attention_kernel(n_heads: int, n_kv_heads: int, head_dim: int, seq_len: int, dtype: torch.dtype,
                     device: torch.device) -> str:
    """The SDPA kernel that causal grouped-query attention of these shapes runs (one sample, forward)."""
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, n_heads, seq_len, head_dim, generator=gen, device=device, dtype=dtype)  # (1, nh, T, hd)
    kv = torch.randn(2, 1, n_kv_heads, seq_len, head_dim, generator=gen, device=device, dtype=dtype)
    with torch.no_grad(), _Dispatched() as seen:
        F.scaled_dot_product_attention(q, kv[0], kv[1], is_causal=True, enable_gqa=n_kv_heads != n_heads)
    return next((KERNELS[op] for op in seen.ops if op in KERNELS), MATH)


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (0 when the compiler was never used)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
