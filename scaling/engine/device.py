"""What one rank computes on: a CUDA device, or on CPU a fixed set of cores that stands for one GPU.

On CPU a rank is a device of `hardware.threads_per_device` threads pinned to cores of its own
(`os.sched_setaffinity`), never "its share of the host": splitting the cores among the ranks would
make every DP curve fall by the split rather than by communication. Rank r of a node takes cores
r·t … r·t + t − 1 of the cores the process may use; with `hardware.oversubscribe` (recorded, and
refused by validation otherwise) ranks beyond the cores wrap around and share them.

On CUDA the rank takes `cuda:<local_rank>` (and threads_per_device host threads, unpinned) and, when
`hardware.memory_gb` is below the card's total, caps its allocator there to emulate a smaller card.
The card's own total is recorded and any disagreement with the profile is stated.
torch and the standard library only.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from scaling.core.schema import HardwareConfig
from scaling.core.units import GIB

PROFILE_TOLERANCE = 0.005
"""Relative difference between hardware.memory_gb and the card's total that is worth a note (0.4 GiB on an
80 GB card: the datasheet's 80 against the 79.18 GiB an H100 states is one)."""


@dataclass
class Device:
    """The device this rank runs on and what the record says about it."""

    device: torch.device
    memory_capacity: str
    """`real` (CUDA), `emulated` (CPU with hardware.memory_gb) or `unlimited`."""
    capacity_bytes: Optional[int]
    """The capacity the rank runs against: hardware.memory_gb, or None without one."""
    env: dict[str, Any] = field(default_factory=dict)
    """Device facts for the record: name, cores or card total, thread count, precision settings."""


def profile_note(memory_gb: float, name: str, total_bytes: int) -> Optional[str]:
    """What to say when hardware.memory_gb and the card's own total disagree by more than PROFILE_TOLERANCE."""
    capacity = memory_gb * GIB
    if abs(capacity - total_bytes) <= PROFILE_TOLERANCE * total_bytes:
        return None
    effect = (
        "the allocator is capped at the profile's value"
        if capacity < total_bytes
        else "the profile is larger than the card: the card decides"
    )
    return f"hardware.memory_gb={memory_gb:g} GiB but {name} reports {total_bytes / GIB:.2f} GiB: {effect}"


def rank_cores(local_rank: int, threads: int, usable: list[int]) -> list[int]:
    """The cores of one rank: a block of `threads` cores of its own, wrapping around when oversubscribed (pure)."""
    if threads < 1 or not usable:
        raise ValueError(f"threads_per_device={threads} on cores {usable}: need >= 1 thread and one usable core")
    return [usable[(local_rank * threads + i) % len(usable)] for i in range(threads)]


_STARTING_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
"""The cores this process could use when it started: a warm rank pins itself again for each point, from these."""


def setup(hw: HardwareConfig, local_rank: int) -> Device:
    """Take this rank's device: pin CPU threads to their cores, or select and cap the CUDA device."""
    capacity = None if hw.memory_gb is None else int(hw.memory_gb * GIB)
    threads = int(hw.threads_per_device)
    torch.set_num_threads(threads)
    if hw.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        props = torch.cuda.get_device_properties(device)
        env: dict[str, Any] = {
            "device_name": props.name,
            "device_total_memory_bytes": int(props.total_memory),
            "memory_profile_note": None,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
            "threads_per_device": threads,
            "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        }
        if capacity is not None:
            env["memory_profile_note"] = profile_note(hw.memory_gb, props.name, props.total_memory)
            if capacity < props.total_memory:
                torch.cuda.set_per_process_memory_fraction(capacity / props.total_memory, device)
        return Device(device, "real", capacity, env)
    usable = _STARTING_CORES or list(range(os.cpu_count() or 1))
    cores = rank_cores(local_rank, threads, usable)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    env = {
        "device_name": platform.processor() or platform.machine(),
        "threads_per_device": torch.get_num_threads(),
        "cores": cores,
    }
    return Device(torch.device("cpu"), "emulated" if capacity is not None else "unlimited", capacity, env)
