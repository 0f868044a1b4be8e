"""The pre-screen: whether a point is launched or recorded `predicted_oom` without a process, against the
device capacity less its reserve, with a margin; near the capacity the trace decides, and a sample of the
skipped points (`launch.prescreen_sample`, chosen by job key) runs anyway to measure the false positives."""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from scaling.core.sample import sampled
from scaling.core.schema import ExperimentConfig, HardwareConfig
from scaling.core.units import GIB
from scaling.core.validate import InvalidConfig
from scaling.model.family import family_of
from scaling.predictor.analytic import ANALYTIC
from scaling.predictor.stage_memory import NO_STAGES, predict_peak, predict_stages
from scaling.store.record import job_key


def capacity_bytes(hw: HardwareConfig) -> Optional[int]:
    """What tensors may use per rank: hardware.memory_gb less hardware.reserve_gb (the CUDA context, NCCL's
    buffers, the allocator's slack), or None for no limit."""
    return None if hw.memory_gb is None else int((hw.memory_gb - hw.reserve_gb) * GIB)


TRACE_BANDS = {"cpu": (0.9, 1.1), "cuda": (0.8, 1.25)}
"""The pre-screen asks the traced predictor when analytic / ((1 + margin) x capacity) falls in the device's band: a
band a few times the analytic model's largest error measured on that device (benchmarks/RESULTS.md: on CPU, against
the tracker, 3.9% in-sample and 0.6% held out; on an H100, against max_memory_allocated, 0.3% eager at ZeRO-0, 2
and 3, 7% at ZeRO-1 and 6% compiled, none of which the trace models either). A trace of a CPU-sized point takes a
second or two of the driver's time and agreed with the analytic figure to the byte on every demo point it ran on."""


def prescreen(
    cfg: ExperimentConfig,
    grad_acc: Optional[int] = None,
    trace: bool = True,
    kept_in: Optional[str | os.PathLike] = None,
) -> dict[str, Any]:
    """The record's `predicted` block: predicted peak bytes per rank, method, fits, and whether to skip.

    `fits` is predicted <= capacity (None without a capacity); `skip` is predicted >
    (1 + launch.prescreen_margin) x capacity with the pre-screen on, and `reason` then says why;
    `sampled`, that such a point is in the sample that runs anyway (launch.prescreen_sample). With `trace`,
    an analytic figure near the threshold is replaced by the traced one (the job's pre-screen does; a
    forecast of a whole grid may not). Never raises for a valid point: a failed trace leaves the analytic
    figure and says so. With `kept_in` (the point's sweep directory) a trace is kept there and read back
    (scaling.predictor.trace.trace_peak_kept): a point the recipe or find-mbs traced is not traced again.
    """
    capacity = capacity_bytes(cfg.hardware)
    margin = float(cfg.launch.prescreen_margin)
    if not family_of(cfg.model).closed_form:  # the analytic model is the built-in family's; the trace decides
        out = _block(cfg, capacity, margin, None)
        if cfg.parallel.pp > 1:  # the trace runs no stages: launched unscreened, and the record says why
            out["trace_error"] = f"not traced: {NO_STAGES}"
            return out
        traced = trace and _trace_into(out, cfg, kept_in)
        return _decide(out, cfg, capacity, margin) if traced and capacity is not None else out
    analytic = predict_peak(cfg, grad_acc)
    out = _block(cfg, capacity, margin, analytic)
    if cfg.parallel.pp > 1:  # each stage's peak; the fullest decides (the trace runs no stages: analytic alone)
        out["stages"] = [st.as_dict() for st in predict_stages(cfg, grad_acc)]
        return out if capacity is None else _decide(out, cfg, capacity, margin)
    if capacity is None:
        return out
    low, high = TRACE_BANDS.get(cfg.hardware.device, TRACE_BANDS["cuda"])
    if trace and cfg.launch.prescreen and low <= analytic.total_bytes / ((1.0 + margin) * capacity) <= high:
        _trace_into(out, cfg, kept_in)
    return _decide(out, cfg, capacity, margin)


def _block(cfg: ExperimentConfig, capacity: Optional[int], margin: float, analytic: Any) -> dict[str, Any]:
    """The block before any trace: the analytic figure (none for a model the user brings), nothing decided yet."""
    return {
        "peak_mem_bytes": None if analytic is None else analytic.total_bytes,
        "method": None if analytic is None else ANALYTIC,
        "fits": None,
        "skip": False,
        "sampled": False,
        "reason": None,
        "capacity_bytes": capacity,
        "reserve_bytes": int(cfg.hardware.reserve_gb * GIB),
        "margin": margin,
        "analytic": None if analytic is None else analytic.as_dict(),
        "traced": None,
    }


def _trace_into(out: dict[str, Any], cfg: ExperimentConfig, kept_in: Optional[str | os.PathLike]) -> bool:
    """Replace the block's figure by the traced one; False (and `trace_error`) when the trace fails."""
    import torch.distributed as dist

    from scaling.predictor.trace import trace_peak, trace_peak_isolated, trace_peak_kept

    try:
        # The sweep driver has no process group of its own, so the trace runs here (under a second for CPU-sized
        # points); a process that has one traces in a fresh interpreter.
        if dist.is_initialized():
            traced = trace_peak_isolated(cfg, timeout_s=min(float(cfg.launch.timeout_s), 300.0))
        else:
            traced = trace_peak(cfg) if kept_in is None else trace_peak_kept(cfg, kept_in)
    except InvalidConfig:  # a plan whose first step fails: refused, not launched
        raise
    except Exception as e:
        out["trace_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        return False
    out.update(peak_mem_bytes=traced.peak_mem_bytes, method=traced.as_dict()["method"], traced=traced.as_dict())
    return True


def _decide(out: dict[str, Any], cfg: ExperimentConfig, capacity: int, margin: float) -> dict[str, Any]:
    """Fits, and whether the pre-screen skips the point (and why), from the block's predicted peak."""
    threshold = (1.0 + margin) * capacity
    peak = out["peak_mem_bytes"]
    out["fits"] = peak <= capacity
    if cfg.launch.prescreen and peak > threshold:
        out["skip"] = True
        out["reason"] = (
            f"predicted peak {peak} bytes per rank ({peak / GIB:.3f} GiB, {out['method']}) > "
            f"(1 + launch.prescreen_margin={margin:g}) x the capacity of {capacity} bytes "
            "(hardware.memory_gb - reserve_gb): not launched (launch.prescreen=false runs it anyway)"
        )
        out["sampled"] = sampled(job_key(cfg), float(cfg.launch.prescreen_sample))
    return out


def predicted_oom(predicted: Mapping[str, Any]) -> bool:
    """Whether a point's pre-screen (`prescreen`'s block) keeps it from launching, so that its status is
    predicted_oom: predicted over the threshold with the pre-screen on, and not in the sample that runs anyway.
    run_point and the grid's forecast (scaling.sweep.grid.predict_new) both decide by it."""
    return bool(predicted["skip"]) and not predicted["sampled"]
