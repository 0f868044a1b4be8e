"""The largest micro-batch that fits, found by prediction and confirmed by at most two runs (`scaling find-mbs`,
`scaling recipe`).

The Playbook's recipe "increase mbs until out of memory", without running out of memory a dozen
times: the analytic predictor brackets the answer, the traced predictor settles it (both for
model, seq_len, dp, ZeRO stage, precision and recompute as given), and then two real points
(`scaling.job.run.run_point`, pre-screen off) confirm it: the predicted mbs must run, mbs + 1 must run
out of memory. If a run contradicts the prediction, mbs is stepped once in the direction the run
showed and that is the second run; the report says what was and was not confirmed.
Needs a capacity: hardware.memory_gb (a real device's, or an emulated one on CPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional, Sequence

from scaling.core.enums import Status
from scaling.core.layout import Layout
from scaling.core.schema import ExperimentConfig
from scaling.core.validate import validate
from scaling.launch.devices import devices_at_hand
from scaling.model.family import checked
from scaling.predictor.calibrated import predicted_peak, predictor_name
from scaling.predictor.prescreen import capacity_bytes
from scaling.predictor.stage_memory import require_stage_predictor


def largest_true(pred: Callable[[int], bool], start: int, limit: int) -> int:
    """Largest m in [1, limit] with pred(m), for pred true up to some m and false above (0 if pred(1) is
    false): gallops from `start` (a good guess saves calls), then bisects."""
    start = min(max(start, 1), limit)
    if pred(start):
        lo, step = start, 1
        while lo + step <= limit and pred(lo + step):
            lo, step = lo + step, step * 2
        hi = min(lo + step, limit + 1)  # pred(hi) is false or hi is past the limit
    else:
        hi, step = start, 1
        while hi - step >= 1 and not pred(hi - step):
            hi, step = hi - step, step * 2
        lo = max(hi - step, 0)  # pred(lo) is true, or lo == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pred(mid) else (lo, mid)
    return lo


@dataclass
class FindMbsResult:
    """What find-mbs found and how sure it is."""

    mbs: int
    """The answer: the largest mbs that fits (0: not even mbs=1)."""
    predicted_mbs: int
    method: str
    capacity_bytes: int
    confirmed: bool
    """True when a run at `mbs` was ok and a run at mbs + 1 ran out of memory."""
    note: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    """(mbs, status, measured peak bytes, job_key, error) of each real run, in order."""
    predictions: dict[int, int] = field(default_factory=dict)
    """mbs -> predicted peak bytes per rank, for every mbs the search looked at."""


def _with_mbs(cfg: ExperimentConfig, mbs: int) -> ExperimentConfig:
    return cfg.changed(train={"mbs": mbs})


def _search_point(cfg: ExperimentConfig) -> ExperimentConfig:
    """The point with a batch that any mbs can split: gbs targets dropped; grad_acc=auto becomes 2 (every
    grad_acc >= 2 holds the same memory: one accumulated copy of the gradients)."""
    grad_acc = 2 if cfg.train.grad_acc == "auto" else cfg.train.grad_acc
    return cfg.changed(train={"gbs": None, "gbs_tokens": None, "grad_acc": grad_acc}, launch={"prescreen": False})


def find_mbs(
    cfg: ExperimentConfig,
    max_mbs: int = 1024,
    traced: bool = True,
    confirm: bool = True,
    launch_point: Optional[Callable[[ExperimentConfig], dict[str, Any]]] = None,
    traces_in: Optional[str | os.PathLike] = None,
) -> FindMbsResult:
    """Largest mbs that fits `cfg`'s capacity: predicted (analytic, calibrated for a model the built-in formulas
    describe, then traced unless `traced` is false; a model without an analytic figure is traced whatever it says),
    confirmed with <= 2 runs. Given
    `traces_in` (a sweep directory), the traces are kept there and read back (scaling.predictor.trace.trace_peak_kept)."""
    cfg = _search_point(cfg)
    capacity = capacity_bytes(cfg.hardware)
    if capacity is None:
        raise ValueError("hardware.memory_gb=null: find-mbs needs a capacity per rank, e.g. hardware.memory_gb=0.02")
    validate(_with_mbs(cfg, 1))
    require_stage_predictor(cfg, "search")
    checked(cfg.model, cfg.train.seq_len, cfg.parallel.layout.tp, zero_stage=cfg.parallel.zero_stage)  # as `run` does
    predictions: dict[int, int] = {}
    grad_acc = int(cfg.train.grad_acc)

    def modelled(m: int) -> int:  # the analytic figure, calibrated by traces for a model it describes
        return predicted_peak(_with_mbs(cfg, m), grad_acc, traces_in)

    # the built-in family and the models its formulas describe have an analytic model (calibrated.predictor_name);
    # any other model has none: the trace searches from mbs=1
    method = predictor_name(cfg)
    analytic = method != "traced"
    guess = largest_true(lambda m: modelled(m) <= capacity, 1, max_mbs) if analytic else 1
    if traced or not analytic:
        from scaling.predictor.trace import trace_peak, trace_peak_kept

        def traced_fits(m: int) -> bool:
            point = _with_mbs(cfg, m)
            predictions[m] = (
                trace_peak(point) if traces_in is None else trace_peak_kept(point, traces_in)
            ).peak_mem_bytes
            return predictions[m] <= capacity

        predicted, method = largest_true(traced_fits, guess, max_mbs), "traced"
    else:
        predicted = guess
        predictions = {m: modelled(m) for m in (guess, guess + 1) if 1 <= m <= max_mbs}
    result = FindMbsResult(
        predicted,
        predicted,
        method,
        capacity,
        False,
        "not confirmed (--no-confirm)",
        predictions=dict(sorted(predictions.items())),
    )
    if confirm:
        needed, at_hand = cfg.parallel.layout.world_size, devices_at_hand(cfg.hardware)
        if launch_point is None and cfg.hardware.device != "cpu" and at_hand < needed:
            result.note = (  # as the recipe does: a launch here would fail on the device, not on its memory
                f"not confirmed: {at_hand} {cfg.hardware.name} device(s) at hand, the point needs {needed}; "
                "run find-mbs where they are, or --no-confirm"
            )
        else:
            _confirm(result, cfg, max_mbs, launch_point)
    return result


def _confirm(
    result: FindMbsResult,
    cfg: ExperimentConfig,
    max_mbs: int,
    launch_point: Optional[Callable[[ExperimentConfig], dict[str, Any]]],
) -> None:
    """At most two real runs around the prediction; updates result.mbs, confirmed and note."""
    if launch_point is None:
        from scaling.job.run import run_point as launch_point

    def status(m: int) -> str:
        rec = launch_point(_with_mbs(cfg, m))
        if rec["status"] == Status.PREDICTED_OOM:  # a stored pre-screen verdict is no measurement: run it
            rec = launch_point(_with_mbs(cfg, m).changed(launch={"rerun": "all"}))
        peak = (rec.get("metrics") or {}).get("peak_mem_bytes")
        result.runs.append(
            {
                "mbs": m,
                "status": rec["status"],
                "peak_mem_bytes": peak,
                "job_key": rec["job_key"],
                "error": rec["error"],
            }
        )
        return rec["status"]

    def unexpected(m: int, s: str) -> bool:
        if s in (Status.OK, Status.OOM):
            return False
        why = result.runs[-1]["error"]  # a failed point says why: a crash, or a loss that is not finite
        result.note = f"mbs={m} ended {s} (neither ok nor oom{': ' + why if why else ''}): nothing confirmed"
        return True

    m = result.predicted_mbs
    first = max(m, 1)
    s1 = status(first)
    if unexpected(first, s1):
        return
    if s1 == Status.OK:
        above = first + 1
        if above > max_mbs:
            result.mbs, result.note = (
                first,
                f"mbs={first} ran; it is the largest searched ({max_mbs}), none above tried",
            )
            return
        s2 = status(above)
        if unexpected(above, s2):
            return
        if s2 == Status.OOM:
            result.mbs, result.confirmed = first, True
            result.note = (
                f"confirmed: mbs={first} ok, mbs={above} oom"
                if m >= 1
                else "prediction said even mbs=1 does not fit, but mbs=1 ran and mbs=2 ran out of memory"
            )
        else:
            result.mbs = above
            result.note = (
                f"contradiction: the prediction said mbs={above} does not fit but it ran; "
                f"answer raised to {above}, the mbs above it is not confirmed (two-run budget spent)"
            )
        return
    # The predicted mbs ran out of memory: step down once.
    below = first - 1
    if below < 1:
        result.mbs, result.confirmed = 0, True
        result.note = "confirmed: not even mbs=1 fits (it ran out of memory)"
        return
    s2 = status(below)
    if unexpected(below, s2):
        return
    result.mbs = below if s2 == Status.OK else 0
    result.confirmed = s2 == Status.OK
    result.note = f"contradiction: the prediction said mbs={first} fits but it ran out of memory; " + (
        f"mbs={below} ran: confirmed {below}"
        if s2 == Status.OK
        else f"mbs={below} ran out of memory too: the answer is below {below}, not found within two runs"
    )


def largest_mbs_by_gpus(
    cfg: ExperimentConfig,
    counts: Sequence[int],
    max_samples: int,
    traces_in: Optional[str | os.PathLike] = None,
    layout: Optional[Layout] = None,
    margin: float = 0.0,
) -> dict[int, int]:
    """The largest mbs that fits per rank at each GPU count (0: not even mbs=1; at most max_samples // dp, the
    batch's share of a dp rank), as the pre-screen's predictor says (analytic; a model the user brings, traced in a
    fake world of that many ranks): a plan for the target hardware, whatever this host could run. `layout` (default
    the config's) is spread over each count (scaling.core.layout.Layout.at: 0 where its degrees do not divide it).
    A fit leaves `margin` of the capacity unused (scaling.predictor.margin). Each mbs is judged at grad_acc 2 where the rank's share of the batch leaves room for
    accumulating (its gradients then stay between micro-steps; every grad_acc >= 2 the same): the share itself, run
    without accumulating, is judged so too (a little conservative, and one predicate for the bisection)."""
    cfg = _search_point(cfg)
    capacity = capacity_bytes(cfg.hardware)
    if capacity is None:
        raise ValueError("hardware.memory_gb=null: a fit per rank needs a capacity, e.g. hardware.memory_gb=0.02")
    template = layout if layout is not None else cfg.parallel.layout
    out, guess = {}, 1
    for n in sorted(set(counts)):
        spread = template.at(n)
        if spread is None:
            out[n] = 0
            continue
        at = cfg.changed(parallel=spread.parallel())
        limit = max_samples // spread.dp
        # pipeline stages: at least pp micro-batches, the most a 1F1B stage keeps in flight (scaling.predictor.stage_memory)
        accumulating = max(2, spread.pp) if limit > 1 else 1
        fits = partial(_fits, at, int(capacity / (1 + margin)), traces_in, grad_acc=accumulating)
        out[n] = largest_true(fits, guess, limit)
        guess = max(out[n], 1)
    return out


def _fits(
    cfg: ExperimentConfig, capacity: int, traces_in: Optional[str | os.PathLike], mbs: int, grad_acc: int
) -> bool:
    """Whether the point at `mbs` and `grad_acc` is predicted to fit `capacity` bytes per rank: analytic, calibrated
    or traced (scaling.predictor.calibrated.fits)."""
    from scaling.predictor.calibrated import fits

    return fits(cfg.changed(train={"mbs": mbs, "grad_acc": grad_acc}), grad_acc, capacity, traces_in)
