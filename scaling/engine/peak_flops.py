"""The peak FLOP/s that MFU and HFU divide by, and those two formulas (a model's FLOPs per token are its family's:
scaling.model). Peak FLOP/s come from the hardware config; on cpu they are measured with a square matmul on threads
pinned as a rank pins its own, best of several repeats, once per host and thread count, and cached with the time
it was taken. The driver measures it inside the point's lease of the host, so no other point runs meanwhile.
torch (imported only to measure) and the standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from scaling.core.enums import Precision
from scaling.core.files import write_json_atomic
from scaling.core.schema import HardwareConfig

PRECISION_DTYPES = {Precision.fp32: "float32", Precision.bf16: "bfloat16"}
"""`train.precision` -> the name of the torch dtype the matmuls run in (the worker's compute dtype too)."""
CACHE_FILE = "peak_flops.json"
MATMUL_SIZE = 1024
"""Side of the square matmul timed on cpu: 2·1024³ ≈ 2.1 GFLOP, milliseconds to a few tenths of a second."""
PEAK_KERNEL = "linear"
"""The op the cpu peak is timed with: `F.linear`, which every matmul of the model's layers runs through. On this
torch's cpu build a bf16 `torch.mm` takes a path ~7x slower than bf16 `F.linear` (1 against 6.7 GFLOP/s on one
core here; fp32 the same), so a peak timed with `torch.mm` put bf16 points at an MFU above 100%. Part of the cache
key, so a peak timed the old way is measured again."""
MEASURE_REPEATS = 10
MEASURE_BUDGET_S = 1.5
"""Repeats stop early past this, so a slow dtype (bf16 without native support) stays under ~2 s."""


def mfu(flops_per_token: float, tokens_per_s_per_gpu: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: flops_per_token · tokens_per_s_per_gpu / peak_flops_per_s (a fraction)."""
    if peak_flops_per_s <= 0:
        raise ValueError(f"peak_flops_per_s={peak_flops_per_s} is invalid: it must be > 0")
    return flops_per_token * tokens_per_s_per_gpu / peak_flops_per_s


def hfu(hardware_flops_per_token: float, tokens_per_s_per_gpu: float, peak_flops_per_s: float) -> float:
    """Hardware FLOPs utilisation: like `mfu` but with the FLOPs that recomputation adds."""
    return mfu(hardware_flops_per_token, tokens_per_s_per_gpu, peak_flops_per_s)


@dataclass(frozen=True)
class PeakFlops:
    """A device's peak FLOP/s and where the figure came from."""

    flops_per_s: float
    source: str
    """`config` (hardware.peak_tflops_*), `measured` (timed now) or `cache` (timed earlier on this host)."""
    measured_at: Optional[str] = None
    """When a measured peak was taken (UTC, ISO 8601); None for a configured one."""
    spread: Optional[float] = None
    """Of a measured peak: (best − median) / best over its timed repeats."""


def configured_peak_flops_per_s(hardware: HardwareConfig, precision: str) -> Optional[float]:
    """The hardware profile's peak FLOP/s at the run's precision (`hardware.peak_tflops_<precision>`), None where it
    is null (a cpu peak is measured instead)."""
    if precision not in PRECISION_DTYPES:
        raise ValueError(
            f"train.precision={precision!r} is invalid: expected one of {sorted(map(str, PRECISION_DTYPES))}"
        )
    key = f"peak_tflops_{precision}"
    tflops = getattr(hardware, key)
    if tflops is None:
        return None
    if tflops <= 0:
        raise ValueError(f"hardware.{key}={tflops} is invalid: it must be > 0 TFLOP/s (or null to measure on cpu)")
    return float(tflops) * 1e12


def resolve_peak_flops(hardware: HardwareConfig, precision: str) -> PeakFlops:
    """Peak FLOP/s of one device at the run's precision: configured, or measured on cpu and cached; with where
    the figure came from and, for a measured one, when it was taken and the spread of its repeats."""
    configured = configured_peak_flops_per_s(hardware, precision)
    if configured is not None:
        return PeakFlops(configured, "config")
    key, device, threads = f"peak_tflops_{precision}", hardware.device, hardware.threads_per_device
    if device != "cpu":
        raise ValueError(
            f"hardware.{key} is null for device={device!r}: only cpu peaks are measured; "
            f"set hardware.{key} to the accelerator's dense peak in TFLOP/s"
        )
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads={threads!r} is invalid: the thread count per rank must be an integer >= 1")
    return _cached_cpu_peak(precision, threads)


def cache_path() -> Path:
    """The peak-FLOPs cache: $SCALING_CACHE_DIR/peak_flops.json, else ~/.cache/scaling/peak_flops.json."""
    root = os.environ.get("SCALING_CACHE_DIR") or Path.home() / ".cache" / "scaling"
    return Path(root) / CACHE_FILE


def cache_key(precision: str, threads: int, device: str = "cpu") -> str:
    """What a measurement depends on: host, device, dtype, pinned thread count and torch version."""
    return f"{socket.gethostname()}|{device}|{precision}|pinned-threads={threads}|torch={torch_version()}|{PEAK_KERNEL}"


def torch_version() -> str:
    """The installed torch's version, as `torch.__version__` gives it, read without importing torch."""
    return importlib.metadata.version("torch")


def measure_matmul_flops_per_s(precision: str, threads: int, size: int = MATMUL_SIZE) -> list[float]:
    """FLOP/s of each timed (size x size) by (size x size) matmul on cpu at `precision`, through `F.linear` as a
    layer's (PEAK_KERNEL), on `threads` threads pinned to the first usable cores (as a rank of threads_per_device pins
    its own): up to MEASURE_REPEATS of them."""
    import torch  # the one place this module needs it: a measurement, taken once per host and thread count
    import torch.nn.functional as F

    dtype = getattr(torch, PRECISION_DTYPES[precision])
    with _pinned_threads(threads), torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(size, size, generator=gen).to(dtype)
        weight = torch.randn(size, size, generator=gen).to(dtype)
        F.linear(x, weight)  # warm-up: thread pool and kernel selection
        rates = []
        started = time.perf_counter()
        for _ in range(MEASURE_REPEATS):
            t0 = time.perf_counter()
            F.linear(x, weight)
            rates.append(2.0 * size**3 / (time.perf_counter() - t0))
            if time.perf_counter() - started > MEASURE_BUDGET_S:
                break
    return rates


@contextlib.contextmanager
def _pinned_threads(threads: int) -> Iterator[None]:
    import torch

    previous_threads = torch.get_num_threads()
    previous_cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    torch.set_num_threads(threads)
    if previous_cores is not None:
        os.sched_setaffinity(0, sorted(previous_cores)[:threads])
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)
        if previous_cores is not None:
            os.sched_setaffinity(0, previous_cores)


def _cached_cpu_peak(precision: str, threads: int) -> PeakFlops:
    path = cache_path()
    key = cache_key(precision, threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The lock makes concurrent ranks of one host wait for a single measurement instead of
    # running several at once, which would also make each of them read low.
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = _read_cache(path)
        if key in entries:
            entry = entries[key]
            return PeakFlops(float(entry["flops_per_s"]), "cache", entry.get("measured_at"), entry.get("spread"))
        rates = measure_matmul_flops_per_s(precision, threads)
        best = max(rates)
        measured = PeakFlops(
            best,
            "measured",
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            (best - statistics.median(rates)) / best,
        )
        entries[key] = {
            "flops_per_s": best,
            "spread": measured.spread,
            "repeats": len(rates),
            "matmul_size": MATMUL_SIZE,
            "measured_at": measured.measured_at,
        }
        write_json_atomic(path, entries)
    return measured


def _read_cache(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return entries if isinstance(entries, dict) else {}
