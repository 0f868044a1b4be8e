"""Peak-memory measurement of one training step, and the emulated device capacity on CPU.

On CUDA the allocator's own counters are the truth (`max_memory_allocated`/`reserved`). On CPU
there is no device allocator, so one untimed step runs under torch's memory tracker (MemTracker,
or FSDPMemTracker for fully_shard models), which counts the bytes of live tensor storages:
parameters, gradients, optimizer states, activations and temporaries. With a capacity set, the
tracked step raises `torch.OutOfMemoryError` the moment live bytes exceed it, which is how a CPU
run emulates a smaller device. torch and the standard library only.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Optional

import torch

_TOTAL = "Total"


class _CapacityCheck:
    """Mixin for torch's trackers: raise OutOfMemoryError once live bytes pass the capacity."""

    capacity_bytes: Optional[int] = None

    def _update_peak_stats(self, peak_state) -> None:  # noqa: ANN001 - torch's private enum
        super()._update_peak_stats(peak_state)  # type: ignore[misc]
        if self.capacity_bytes is None:
            return
        for dev, snap in self._curr_mem_snap.items():  # type: ignore[attr-defined]
            if snap[_TOTAL] > self.capacity_bytes:
                raise torch.OutOfMemoryError(
                    f"emulated capacity exceeded on {dev}: {snap[_TOTAL]} live bytes > "
                    f"hardware.memory_gb capacity of {self.capacity_bytes} bytes"
                )


@functools.cache
def _trackers() -> tuple[type, type]:
    """torch's trackers with the capacity check; imported on first use, since importing
    torch.distributed._tools pulls in the compiler stack (seconds) that CUDA runs never need."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    return (type("CapacityMemTracker", (_CapacityCheck, MemTracker), {}),
            type("CapacityFSDPMemTracker", (_CapacityCheck, FSDPMemTracker), {}))


class PeakMemory:
    """Result of a tracked step: peak live bytes and the breakdown at the peak."""

    def __init__(self, tracker: Any) -> None:
        self.peak_bytes: int = 0
        self.breakdown: dict[str, int] = {}
        self._tracker = tracker

    def new_micro_step(self) -> None:
        """Call before each forward: the tracker's per-module stats allow one forward per module,
        while the step's overall peak (what is reported) survives the reset."""
        self._tracker.reset_mod_stats()


@contextlib.contextmanager
def tracked_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    fsdp: bool,
    capacity_bytes: Optional[int],
) -> Iterator[PeakMemory]:
    """Run the body as one step under torch's memory tracker; fills the yielded PeakMemory."""
    plain, sharded = _trackers()
    tracker = sharded(model, optimizer) if fsdp else plain()
    tracker.capacity_bytes = capacity_bytes
    if not fsdp:  # FSDPMemTracker registers its module and optimizer itself
        # ZeroRedundancyOptimizer keeps this rank's states in its inner optimizer.
        tracker.track_external(model, getattr(optimizer, "optim", optimizer))
    result = PeakMemory(tracker)
    with tracker:
        yield result
    peak = tracker.get_tracker_snapshot("peak")
    for snap in peak.values():
        if snap[_TOTAL] >= result.peak_bytes:
            result.peak_bytes = snap[_TOTAL]
            result.breakdown = {str(k): int(v) for k, v in snap.items()}
