"""Peak-memory measurement of a rank: the training steps' peak, the build's peak, and the emulated capacity on CPU.

On CUDA the allocator's own counters are the truth (`max_memory_allocated`/`reserved`, reset once the
model, its wrapping and its optimizer exist, so building is measured apart from training), next to
what the device really had in use (`torch.cuda.mem_get_info`: allocator reserve, CUDA context, NCCL
buffers). On CPU there is no device allocator, so one untimed step runs under torch's memory tracker (MemTracker,
or FSDPMemTracker for fully_shard models), which counts the bytes of live tensor storages:
parameters, gradients, optimizer states, activations and temporaries. With a capacity set, the
tracked step notes the moment live bytes exceed it and every rank raises `EmulatedOutOfMemoryError` at its end,
which is how a CPU run emulates a smaller device. Beside it, as a measure the tracker does not make, each rank reads its
peak resident memory from the OS (`VmHWM`, reset through /proc/self/clear_refs) for building and for
training, as growth over its resident memory after imports. torch and the standard library only.
"""

from __future__ import annotations

import contextlib
import functools
import re
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist

_TOTAL = "Total"


class EmulatedOutOfMemoryError(torch.OutOfMemoryError):
    """A CPU rank's live bytes passed the emulated capacity (hardware.memory_gb) in the tracked step. Every rank
    raises it at once, after the step and outside any collective (`raise_if_exceeded`), so no rank is left waiting
    for a peer: a fresh launch ends cleanly, and warm ranks go on to their next point."""


class _CapacityCheck:
    """Mixin for torch's trackers: note the first moment live bytes pass the capacity (the step goes on, so that
    every rank reaches its end together and learns of it there)."""

    capacity_bytes: Optional[int] = None
    exceeded: Optional[str] = None

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)  # type: ignore[misc]
        if self.capacity_bytes is None or self.exceeded is not None:
            return
        for dev, snap in self._curr_mem_snap.items():  # type: ignore[attr-defined]
            if snap[_TOTAL] > self.capacity_bytes:
                self.exceeded = (
                    f"emulated capacity exceeded on {dev}: {snap[_TOTAL]} live bytes > "
                    f"hardware.memory_gb capacity of {self.capacity_bytes} bytes"
                )


def raise_if_exceeded(exceeded: Optional[str]) -> None:
    """Every rank with the others, after a tracked step: raise EmulatedOutOfMemoryError on all of them, naming the
    first rank whose live bytes passed the capacity, if any did (a collective: every rank calls it)."""
    found: list[Optional[str]] = [exceeded]
    if dist.is_initialized() and dist.get_world_size() > 1:
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, exceeded)
    first = next(((rank, message) for rank, message in enumerate(found) if message), None)
    if first is not None:
        raise EmulatedOutOfMemoryError(f"rank {first[0]}: {first[1]}")


@functools.cache
def load_trackers() -> tuple[type, type]:
    """torch's trackers with the capacity check; imported on first use, since importing
    torch.distributed._tools pulls in the compiler stack (seconds) that CUDA runs never need."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    return (
        type("CapacityMemTracker", (_CapacityCheck, MemTracker), {}),
        type("CapacityFSDPMemTracker", (_CapacityCheck, FSDPMemTracker), {}),
    )


class PeakMemory:
    """Result of a tracked step: peak live bytes and the breakdown at the peak."""

    def __init__(self, tracker: Any) -> None:
        self.peak_bytes: int = 0
        self.breakdown: dict[str, int] = {}
        self.exceeded: Optional[str] = None
        """What the capacity check noted when live bytes first passed the capacity (None: they never did)."""
        self._tracker = tracker

    def new_micro_step(self, module: Optional[torch.nn.Module] = None) -> None:
        """Call before each forward: the tracker's per-module stats allow one forward per module,
        while the step's overall peak (what is reported) survives the reset. With `module` (a pipeline stage's,
        whose forward comes next while other stages' backward passes are still to come) only its modules' stats."""
        if module is None:
            self._tracker.reset_mod_stats()
            return
        for sub in module.modules():
            self._tracker.memory_tracking.pop(sub, None)


@contextlib.contextmanager
def tracked_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    fsdp: bool,
    capacity_bytes: Optional[int],
    follow_modules: bool = True,
) -> Iterator[PeakMemory]:
    """Run the body as one step under torch's memory tracker; fills the yielded PeakMemory. Without
    `follow_modules` the tracker counts live bytes without hooking each module's forward and backward (a backward
    split into an input and a weight part, as zero-bubble pipeline schedules run it, calls `autograd.grad` on a
    stage's received input, which the module hooks cannot follow): the peak is the same count, the breakdown at it
    tells fewer kinds apart."""
    plain, sharded = load_trackers()
    tracker = sharded(model, optimizer) if fsdp else plain()
    if not follow_modules:
        tracker._mod_tracker = _unhooked()
    tracker.capacity_bytes = capacity_bytes
    if not fsdp:  # FSDPMemTracker registers its module and optimizer itself
        # ZeroRedundancyOptimizer keeps this rank's states in its inner optimizer.
        tracker.track_external(model, getattr(optimizer, "optim", optimizer))
    result = PeakMemory(tracker)
    with tracker:
        yield result
    result.exceeded = tracker.exceeded
    peak = tracker.get_tracker_snapshot("peak")
    for snap in peak.values():
        if snap[_TOTAL] >= result.peak_bytes:
            result.peak_bytes = snap[_TOTAL]
            result.breakdown = {str(k): int(v) for k, v in snap.items()}


def _unhooked() -> Any:
    """A module tracker that hooks no module (it stays at the root, outside any backward)."""
    from torch.distributed._tools.mod_tracker import ModTracker

    class Unhooked(ModTracker):
        def register_user_hooks(self, *args: Any, **kwargs: Any) -> None:
            pass

        def clear_user_hooks(self) -> None:
            pass

        def __enter__(self) -> Unhooked:
            return self

        def __exit__(self, *args: Any) -> None:
            pass

    return Unhooked()


class ResidentMemory:
    """A process's resident memory from the OS: growth of its peak over a baseline, phase by phase (Linux)."""

    def __init__(self) -> None:
        self.baseline_bytes = self._read("VmRSS")
        self.available = self.baseline_bytes is not None and self.reset_peak()

    @staticmethod
    def _read(key: str) -> Optional[int]:
        try:
            match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
        except OSError:
            return None
        return int(match.group(1)) * 1024 if match else None

    def reset_peak(self) -> bool:
        """Start a new phase: the kernel's peak (VmHWM) drops to the current resident memory."""
        try:
            Path("/proc/self/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    def peak_growth_bytes(self) -> Optional[int]:
        """Peak resident bytes since the last reset, minus the baseline after imports (None off Linux)."""
        peak = self._read("VmHWM") if self.available else None
        return None if peak is None else max(0, peak - self.baseline_bytes)


def cuda_memory(device: torch.device) -> dict[str, int]:
    """The allocator's peaks since the last reset and what the device has in use now (all in bytes)."""
    stats = torch.cuda.memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    return {
        "peak_allocated": int(torch.cuda.max_memory_allocated(device)),
        "peak_reserved": int(torch.cuda.max_memory_reserved(device)),
        "num_ooms": int(stats.get("num_ooms", 0)),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "device_used": int(total - free),
    }


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer states this rank holds (ZeroRedundancyOptimizer: its own partition; FSDP2: the local
    shard of each DTensor state, not the whole tensor it stands for)."""
    inner = getattr(optimizer, "optim", optimizer)
    local = [
        t.to_local() if hasattr(t, "to_local") else t
        for state in inner.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    ]
    return sum(t.numel() * t.element_size() for t in local)
