"""The next measurement: the one point (a GPU count and configuration) whose measurement would narrow the recipe's
least certain answer most, with the band expected after it and its cost in device-hours. Each option below the
decisive count is simulated as a record at the current nominal figure with the run-to-run spread, the estimate
refitted with it, and the decisive band read again; the narrowest wins (the cheaper on a tie). Measuring the
decisive count itself would answer it outright at its full cost, so it is not an option.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from scaling.core.layout import Layout, configuration_name
from scaling.recipe.answer import Row, gpus_said
from scaling.recipe.options import MEASURED, Candidate, Estimate, Estimator, Split, split

LAUNCH_OVERHEAD_S = {"cuda": 90.0, "cpu": 10.0}
"""Device-seconds a launch holds besides its steps, per device: interpreter, torch, process group, build, teardown
(the GPU page's start-up share; on CPU the demo's)."""
MIN_NARROWING = 0.01
"""A measurement is suggested only where it narrows the band's relative half-width by at least this (one point:
±27% to ±27% buys nothing)."""
SIMULATED_SPREAD = (-0.02, -0.01, 0.0, 0.01, 0.02)
"""The simulated measurement's timed steps: the nominal step time moved by the run-to-run spread (2%)."""


@dataclass(frozen=True)
class NextMeasurement:
    """The point to measure next and what it would buy."""

    gpus: int
    zero_stage: int
    recompute: str
    mbs: int
    grad_acc: int
    nodes: int
    device_hours: float
    narrows: int
    """The GPU count whose band it narrows: the recipe's least certain row."""
    half_width_now: float
    half_width_after: float
    """The relative half-width of that row's band now, and as the simulation expects it after the measurement."""
    command: Optional[str] = None
    tp: int = 1
    dp_shard: Optional[int] = None

    @property
    def layout(self) -> Layout:
        """The layout of the point to measure."""
        layout = Layout.over(self.gpus, self.zero_stage, shard_group=self.dp_shard, tp=self.tp)
        assert layout is not None, f"tp={self.tp} does not divide {self.gpus} GPUs"
        return layout

    def sentence(self) -> str:
        """`Next measurement: 64 GPUs, ZeRO-3, mbs 1, grad_acc 4, recompute none (one 8-node job, about 0.1
        device-hours): the 256-GPU band would narrow from ±38% to about ±10%.`"""
        job = f"one {self.nodes}-node job" if self.nodes > 1 else "one job"
        run = configuration_name(self.layout, self.recompute, self.mbs, self.grad_acc)
        return (
            f"Next measurement: {gpus_said(self.gpus)}, {run} ({job}, {_hours(self.device_hours)}): the "
            f"{self.narrows}-GPU band would narrow from ±{self.half_width_now:.0%} to about "
            f"±{self.half_width_after:.0%}."
        )

    def to_json(self) -> dict[str, Any]:
        """As recipe.json holds it."""
        return asdict(self)


def _hours(h: float) -> str:
    if h * 60 < 1:
        return "under a device-minute"
    return f"about {h * 60:.0f} device-minutes" if h < 1 else f"about {h:.1f} device-hours"


def half_width(e: Estimate) -> float:
    """The band's relative half-width: (high - low) / 2 over the nominal figure."""
    return (e.high - e.low) / (2 * e.tokens_per_s_per_gpu)


def simulated_record(c: Candidate, s: Split, e: Estimate, seq_len: int) -> dict[str, Any]:
    """A record at split `s` whose timed steps are `e`'s nominal step time with the run-to-run spread."""
    times = [e.step_time_s * (1 + d) for d in SIMULATED_SPREAD]
    layout = c.layout.with_dp(s.dp)
    return {
        "job_key": f"simulated-{configuration_name(layout, c.recompute, s.mbs, s.grad_acc)}",
        "status": "ok",
        "config": {"parallel": layout.parallel(), "train": {"recompute": c.recompute, "mbs": s.mbs}},
        "derived": {"grad_acc": s.grad_acc},
        "metrics": {
            "step_times_s": times,
            "step_time_s": e.step_time_s,
            "tokens_per_s_per_gpu": layout.per_gpu(s.mbs * s.grad_acc * seq_len) / e.step_time_s,
            "noise_band_frac": max(SIMULATED_SPREAD),
            "peak_mem_bytes": None,
        },
    }


def suggest(
    candidates: Sequence[Candidate],
    rows: Sequence[Row],
    records: Sequence[Mapping[str, Any]],
    rebuild: Callable[[list[Mapping[str, Any]]], Estimator],
    gbs_samples: int,
    seq_len: int,
    devices_per_node: Optional[int],
    step_count: int,
    device: str,
    command: Optional[Callable[[Candidate, Split], str]] = None,
    max_grad_acc: Optional[int] = None,
) -> Optional[NextMeasurement]:
    """The measurement that narrows the widest band among the rows not measured (None: nothing to narrow, no
    smaller count of its configuration to measure, or none whose simulated record narrows it by MIN_NARROWING).
    `rebuild` makes the estimator of a list of records; the point runs at most `max_grad_acc` micro-steps, as the
    recipe's own measurements do (scaling.recipe.measure)."""
    open_rows = [r for r in rows if r.tokens_per_s_per_gpu and r.source != MEASURED]
    if not open_rows:
        return None
    target = max(
        open_rows, key=lambda r: (r.tokens_per_s_per_gpu_high - r.tokens_per_s_per_gpu_low) / r.tokens_per_s_per_gpu
    )
    layout = target.layout
    assert layout is not None and target.recompute is not None, "an open row runs a configuration"
    c = next(c for c in candidates if c.runs(layout, target.recompute))
    at_target = Split(layout.dp, target.mbs, target.grad_acc, target.gbs_tokens, bool(target.gbs_exact))
    now_estimator = rebuild(list(records))
    now = now_estimator(c, at_target)
    if not isinstance(now, Estimate):
        return None
    counts = sorted({2**k for k in range(target.gpus.bit_length())} | {r.gpus for r in rows})
    best: Optional[NextMeasurement] = None
    for n, at in ((n, c.at(n)) for n in counts if n < target.gpus and c.mbs_for(n) >= target.mbs):
        if at is None:
            continue
        s = split(gbs_samples, seq_len, at.dp, target.mbs)
        e = now_estimator(c, s) if s is not None and s.mbs == target.mbs and s.exact else None
        if not isinstance(e, Estimate) or e.source == MEASURED:
            continue
        if max_grad_acc is not None and s.grad_acc > max_grad_acc:  # the point as the recipe would run it
            s = Split(s.dp, s.mbs, max_grad_acc, max_grad_acc * s.mbs * s.dp * seq_len, False)
            e = now_estimator(c, s)
            if not isinstance(e, Estimate):
                continue
        after = rebuild([*records, simulated_record(c, s, e, seq_len)])(c, at_target)
        if not isinstance(after, Estimate) or half_width(after) > half_width(now) - MIN_NARROWING:
            continue  # a point the band would not narrow by (a refit on it can widen the draws' spread)
        nodes = -(-n // devices_per_node) if devices_per_node else 1
        seconds = LAUNCH_OVERHEAD_S.get(device, LAUNCH_OVERHEAD_S["cuda"]) + step_count * e.step_time_s
        option = NextMeasurement(
            n,
            int(at.zero_stage),
            c.recompute,
            s.mbs,
            s.grad_acc,
            nodes,
            n * seconds / 3600,
            target.gpus,
            half_width(now),
            half_width(after),
            command(c, s) if command else None,
            at.tp,
            at.dp_shard,
        )
        if best is None or (option.half_width_after, option.device_hours) < (best.half_width_after, best.device_hours):
            best = option
    return best
