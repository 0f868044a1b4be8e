"""A training step at dp=n with a fixed global batch, its fit to a sweep's measured DP curve, and the
extrapolation past the measured dp with its uncertainty.

One configuration (model, seq_len, mbs, ZeRO stage, precision; dp varies) takes per optimizer step

    grad_acc(n) = gbs / (mbs·n)        (a fixed global batch; a sweep that fixed grad_acc instead keeps it)
    step_s(n)   = grad_acc(n)·compute_s + exposed communication(n)

so as dp grows, grad_acc falls and communication is amortised over fewer micro-steps. Communication per
stage, as the engine issues it (bytes from the parameter count; gradients are reduced in fp32, parameters
travel in bf16 only under FSDP2's mixed precision, DDP's parameters are fp32):

  ZeRO-0  one all-reduce of the gradients per step, bucketed and overlapped with the last backward
  ZeRO-1  the same, plus an all-gather of the updated parameter shards after the optimizer (exposed)
  ZeRO-2  a reduce-scatter of the gradients every micro-step, overlapped with its backward, and the
          parameters all-gathered once per step, prefetched beside the forward
  ZeRO-3  a reduce-scatter every micro-step and parameter all-gathers in its forward and again in its
          backward, overlapped with that micro-step's compute
  (with parallel.fsdp_grad_reduce=last_micro_step, ZeRO-2/3 reduce-scatter once, in the last backward, and
  gather the parameters on every micro-step; records without the setting did that)

An overlap fraction o hides o of the overlappable communication, at most the compute it runs beside:
hidden = min(o·comm, window), the window being the backward (BACKWARD_SHARE of a micro-step's compute) or,
for ZeRO-3, the whole micro-step. Each collective costs what `scaling.core.network` says at its tier.

The parameters come from one of three sources, each fitted here against the sweep's measured points:
(a) "sweep": the compute time and whatever α-β figures the measured dp identify and resolve above the
    timing noise (o is then 0: the figures are those of exposed communication; an α within the noise is set
    to 0, since it would be extrapolated over ring lengths far past the measured ones); (b) "profile" and
    (c) "published": the network is given (with its spread), the compute time and o are fitted.
The uncertainty comes from bootstrap draws: each point's timed steps resampled (and the points themselves,
where more were measured than parameters fitted), refitted, with the source's network draws; (a)'s draws
refit every identified α, (b)'s and (c)'s draw the overlap among the values that fit within the noise. The
band is the 2.5th-97.5th percentile of the draws, the knee's range the same percentiles of their knees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.dp_scaling import DEFAULT_THRESHOLD, dp_axis, find_knee
from analysis.figures import new_figure
from scaling.core.network import (
    INTER,
    INTRA,
    PROFILE_FILE,
    TIERS,
    AlphaBeta,
    Network,
    NetworkEstimate,
    load_profile,
    profile_estimate,
    published_estimate,
    ring_cost,
    tier_of,
    with_fallback,
)

MAX_DP = 1024
EXTRAPOLATED_CONFIGS = 3
"""Configurations the report extrapolates: the fastest measured at two or more dp."""
BACKWARD_SHARE = 2 / 3
"""Share of a micro-step's compute in backward: twice the forward's FLOPs (no recomputation)."""
BAND = (2.5, 97.5)
"""Percentiles of the draws that bound the band."""
N_DRAWS = 200
OVERLAP_GRID = np.linspace(0.0, 1.0, 101)
CHI2_95 = 3.84
MISFIT_WARNING = 0.10
"""A source whose nominal model misses a measured step time by more than this is flagged in the report."""
GRAD_BYTES = 4
"""Gradients are reduced in fp32 at every stage: DDP's parameters (and so gradients) stay fp32 under autocast,
and FSDP2's MixedPrecisionPolicy reduces in fp32."""
MICRO, STEP = "micro-step", "step"
EVERY, LAST = "every_micro_step", "last_micro_step"
"""`parallel.fsdp_grad_reduce` (scaling.core.validate.FSDP_GRAD_REDUCE)."""
BACKWARD, WHOLE = "backward", "micro-step"


@dataclass(frozen=True)
class Collective:
    """One collective of a stage: what it moves, how often, and what compute it can hide behind (None: none)."""

    op: str
    moves: str
    """`grad` or `param`."""
    per: str
    """MICRO (every micro-step) or STEP (once per optimizer step)."""
    window: Optional[str]
    """BACKWARD, WHOLE (the micro-step's forward and backward) or None (exposed)."""


STAGE_COLLECTIVES: dict[tuple[int, str], tuple[Collective, ...]] = {
    # DDP: one bucketed all-reduce in the last backward; ZeroRedundancyOptimizer gathers the updated shards in step()
    (0, EVERY): (Collective("all_reduce", "grad", STEP, BACKWARD),),
    (1, EVERY): (Collective("all_reduce", "grad", STEP, BACKWARD), Collective("all_gather", "param", STEP, None)),
    # FSDP2: gathers prefetched beside the forward; ZeRO-2 keeps its parameters gathered between micro-steps
    (2, EVERY): (Collective("reduce_scatter", "grad", MICRO, BACKWARD), Collective("all_gather", "param", STEP, WHOLE)),
    (3, EVERY): (Collective("reduce_scatter", "grad", MICRO, WHOLE), Collective("all_gather", "param", MICRO, WHOLE),
                 Collective("all_gather", "param", MICRO, WHOLE)),
    # parallel.fsdp_grad_reduce=last_micro_step: one reduce-scatter in the last backward; parameters resharded
    # after every backward, so gathered again on every micro-step
    (2, LAST): (Collective("reduce_scatter", "grad", STEP, BACKWARD), Collective("all_gather", "param", MICRO, WHOLE)),
    (3, LAST): (Collective("reduce_scatter", "grad", STEP, BACKWARD), Collective("all_gather", "param", MICRO, WHOLE),
                Collective("all_gather", "param", MICRO, WHOLE)),
}
"""What each (ZeRO stage, parallel.fsdp_grad_reduce) communicates; stages 0-1 do not read the latter."""
WINDOW_SHARE = {BACKWARD: BACKWARD_SHARE, WHOLE: 1.0}


@dataclass(frozen=True)
class Workload:
    """The fixed part of one configuration: what it communicates and how its global batch splits over dp."""

    zero_stage: int
    n_params: int
    precision: str
    mbs: int
    seq_len: int
    gbs: Optional[int]
    """Global batch in samples, fixed across dp; None when the sweep fixed grad_acc instead."""
    grad_acc: int = 1
    """grad_acc at every dp when gbs is None."""
    fsdp_grad_reduce: str = EVERY
    """Stages 2-3: reduce-scatter on every micro-step or only the last (`parallel.fsdp_grad_reduce`)."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage}: valid stages are 0, 1, 2, 3")
        if self.fsdp_grad_reduce not in (EVERY, LAST):
            raise ValueError(f"fsdp_grad_reduce={self.fsdp_grad_reduce!r}: valid are {EVERY}, {LAST}")

    def collectives(self) -> tuple[Collective, ...]:
        """The collectives this configuration issues (STAGE_COLLECTIVES)."""
        return STAGE_COLLECTIVES[self.zero_stage, EVERY if self.zero_stage <= 1 else self.fsdp_grad_reduce]

    def grad_acc_at(self, n: int) -> Optional[int]:
        """grad_acc at dp=n, or None when the fixed global batch does not split into whole micro-steps."""
        if self.gbs is None:
            return self.grad_acc
        ga, rest = divmod(self.gbs, self.mbs * n)
        return ga if ga >= 1 and rest == 0 else None

    def bytes_of(self, moves: str) -> float:
        """Bytes one collective of this kind moves (the whole buffer)."""
        if moves == "grad":
            return self.n_params * GRAD_BYTES
        return self.n_params * (2 if self.zero_stage >= 2 and self.precision == "bf16" else 4)

    def batch(self) -> str:
        """How the global batch splits over dp, in words."""
        if self.gbs is None:
            return (f"the sweep does not fix the global batch across dp: extrapolated at grad_acc={self.grad_acc} "
                    "(that of the largest measured dp), the global batch growing with dp")
        return f"global batch fixed at {self.gbs} samples: grad_acc = {self.gbs} / ({self.mbs} × dp)"

    def tokens_per_rank(self, n: int) -> float:
        """Tokens one rank processes per optimizer step at dp=n."""
        return float(self.mbs * self.seq_len * (self.grad_acc_at(n) or np.nan))


def comm_groups(w: Workload, net: Network, n: int) -> dict[tuple[str, Optional[str]], float]:
    """Seconds of communication per (how often, window), summed over the stage's collectives at dp=n."""
    groups: dict[tuple[str, Optional[str]], float] = {}
    if n < 2:
        return groups
    tier = net.tier(n)
    if tier is None:
        raise ValueError(f"dp={n}: the network has no figures for its tier ({tier_of(n, net.devices_per_node)})")
    for c in w.collectives():
        key = (c.per, c.window)
        groups[key] = groups.get(key, 0.0) + tier.time_s(c.op, n, w.bytes_of(c.moves))
    return groups


def step_time_s(w: Workload, net: Network, n: int, compute_s: float, overlap: float,
                grad_acc: Optional[int] = None) -> float:
    """Seconds of one optimizer step at dp=n: grad_acc micro-steps of compute plus exposed communication."""
    ga = grad_acc if grad_acc is not None else w.grad_acc_at(n)
    if ga is None:
        raise ValueError(f"dp={n}: gbs={w.gbs} does not split into whole micro-steps of mbs={w.mbs}")
    total = ga * compute_s
    for (per, window), comm_s in comm_groups(w, net, n).items():
        hidden = 0.0 if window is None else min(overlap * comm_s, WINDOW_SHARE[window] * compute_s)
        total += (comm_s - hidden) * (ga if per == MICRO else 1)
    return total


# --- the measured points of one configuration ----------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One measured dp of a configuration: its grad_acc and the timed steps (their median is the step time)."""

    dp: int
    grad_acc: int
    step_times_s: tuple[float, ...]

    @property
    def step_time_s(self) -> float:
        """Median of the timed steps."""
        return float(np.median(self.step_times_s))


def _design(w: Workload, points: Sequence[Point], dpn: Optional[int]) -> np.ndarray:
    """Columns [compute_s, 1/β and α of each tier] of the step times with no overlap (one row per point)."""
    rows = []
    for p in points:
        row = [float(p.grad_acc)] + [0.0] * (2 * len(TIERS))
        if p.dp >= 2:
            t = TIERS.index(INTRA if dpn is None or p.dp <= dpn else INTER)
            for c in w.collectives():
                steps, moved = ring_cost(c.op, p.dp, w.bytes_of(c.moves))
                times = p.grad_acc if c.per == MICRO else 1
                row[1 + 2 * t] += times * moved
                row[2 + 2 * t] += times * steps
        rows.append(row)
    return np.asarray(rows)


ALPHA_COLUMNS = tuple(2 + 2 * i for i in range(len(TIERS)))
"""Columns of `_design` that hold a tier's α (1 + 2i its 1/β)."""


def identifiable(design: np.ndarray) -> list[int]:
    """Columns the points can tell apart, in order of priority: compute, then each tier's β before its α."""
    free: list[int] = []
    for j in range(design.shape[1]):
        if not design[:, j].any():
            continue
        trial = design[:, free + [j]]
        trial = trial / np.linalg.norm(trial, axis=0)
        if np.linalg.matrix_rank(trial, tol=1e-9) == len(free) + 1:
            free.append(j)
    return free


def _solve_nonnegative(a: np.ndarray, t: np.ndarray, free: list[int]) -> np.ndarray:
    """Least squares in relative error over the free columns; a network figure fitted below 0 is set to 0."""
    cols = list(free)
    while True:
        sol, *_ = np.linalg.lstsq(a[:, cols] / t[:, None], np.ones_like(t), rcond=None)
        negative = [i for i, (c, v) in enumerate(zip(cols, sol)) if v < 0 and c != 0]
        if not negative:
            break
        del cols[min(negative, key=lambda i: sol[i])]
    coef = np.zeros(a.shape[1])
    coef[cols] = sol
    return coef


@dataclass(frozen=True)
class Fit:
    """Fitted parameters of one configuration under one source."""

    compute_s: float
    overlap: float
    network: Network
    overlap_range: tuple[float, float] = (0.0, 0.0)
    """Overlap values the points cannot tell from the best: squared relative error within the 95% bound of
    one parameter (χ² of 3.84) at the noise of the medians."""


def resolved_columns(a: np.ndarray, t: np.ndarray, free: list[int], noise_var: float
                     ) -> tuple[list[int], dict[int, str]]:
    """The free columns the points resolve, and why each other one was set to 0: a network figure fitted below 0,
    or an α within the noise (|t| < 2), which would otherwise be extrapolated over ring lengths far beyond
    the measured ones."""
    cols, dropped = list(free), {}
    while True:
        x = a[:, cols] / t[:, None]
        norms = np.linalg.norm(x, axis=0)
        x = x / norms  # unit columns: 1/β and α differ by ten orders of magnitude
        coef, *_ = np.linalg.lstsq(x, np.ones_like(t), rcond=None)
        negative = [c for i, c in enumerate(cols) if c != 0 and coef[i] < 0]
        if negative:
            # a 1/β below 0 beside its α: α took more than its share, β-only is the cautious extrapolation
            worst = next((c + 1 for c in negative if c + 1 in ALPHA_COLUMNS and c + 1 in cols), negative[0])
            cols.remove(worst)
            dropped[worst] = "fitted below 0" if worst in negative else "traded against a β below 0"
            continue
        resid = x @ coef - 1
        var = max(noise_var, float(resid @ resid) / (len(t) - len(cols)) if len(t) > len(cols) else 0.0)
        se = np.sqrt(np.maximum(np.diag(np.linalg.pinv(x.T @ x)) * var, 0.0))
        stat = {c: coef[i] / se[i] if se[i] > 0 else np.inf for i, c in enumerate(cols)}
        # an α stays only when it and its tier's β both stand out of the noise: with β unresolved, α and β trade
        # for each other, and α's share grows with the ring length past the measured dps while β's does not
        weak = {c: min(v, stat.get(c - 1, 0.0)) for c, v in stat.items() if c in ALPHA_COLUMNS
                and min(v, stat.get(c - 1, 0.0)) < 2}
        if not weak:
            return cols, dropped
        worst = min(weak, key=weak.get)
        cols.remove(worst)
        dropped[worst] = f"not resolved above the timing noise (t = {weak[worst]:.1f})"


def fit_sweep(w: Workload, points: Sequence[Point], dpn: Optional[int], free: list[int]) -> Fit:
    """Source (a): compute_s and the α-β figures of the free columns of `_design`, no overlap (the figures are
    those of exposed communication); a tier measured but not resolved costs nothing."""
    a = _design(w, points, dpn)
    t = np.array([p.step_time_s for p in points])
    coef = _solve_nonnegative(a, t, free)
    tiers = {}
    for i, tier in enumerate(TIERS):
        cols = (1 + 2 * i, 2 + 2 * i)
        if a[:, cols].any():  # measured: what was not resolved costs nothing
            inv_beta, alpha = coef[cols[0]], coef[cols[1]]
            tiers[tier] = AlphaBeta(float(alpha), float(1.0 / inv_beta) if inv_beta > 0 else float("inf"))
    return Fit(float(coef[0]), 0.0, Network(tiers, dpn))


def noise_variance(points: Sequence[Point]) -> float:
    """Pooled variance of the relative error of a point's median step time, from the spread of its timed steps."""
    variances = [np.var(p.step_times_s, ddof=1) / p.step_time_s**2 * np.pi / (2 * len(p.step_times_s))
                 for p in points if len(p.step_times_s) > 1]
    return float(np.mean(variances)) if variances else 0.0


def fit_given(w: Workload, points: Sequence[Point], net: Network, rng: Optional[np.random.Generator] = None) -> Fit:
    """Sources (b) and (c): the network is given; compute_s and the overlap fitted (overlap on a grid of 0.01:
    the middle of the values that fit within the noise, or one of them drawn at random when `rng` is given)."""
    usable = [p for p in points if net.reaches(p.dp)]
    t = np.array([p.step_time_s for p in usable])
    ga = np.array([float(p.grad_acc) for p in usable])
    # per point: seconds of each group and how it counts (times per step, compute share of its window)
    groups = [comm_groups(w, net, p.dp) for p in usable]
    keys = sorted({k for g in groups for k in g}, key=str)
    x = np.array([[g.get(k, 0.0) for k in keys] for g in groups]).reshape(len(usable), len(keys))
    times = np.array([[p.grad_acc if k[0] == MICRO else 1 for k in keys] for p in usable]).reshape(x.shape)
    share = np.array([WINDOW_SHARE.get(k[1], 0.0) for k in keys])
    hides = np.array([k[1] is not None for k in keys])
    o = OVERLAP_GRID[:, None, None]                                   # (overlap, point, group)
    c = np.full(len(OVERLAP_GRID), np.sum(ga * t) / np.sum(ga * ga))  # start from no communication at all
    for _ in range(12):  # the saturation pattern (o·comm above its window) settles in a few rounds
        sat = hides & (o * x > share * c[:, None, None])
        a = ga - np.sum(np.where(sat, times * share, 0.0), axis=2)
        b = np.sum(times * np.where(sat, x, np.where(hides, (1 - o) * x, x)), axis=2)
        num, den = np.sum(a * (t - b) / t**2, axis=1), np.sum(a * a / t**2, axis=1)
        c = np.where(den > 0, num / np.where(den > 0, den, 1.0), c)
        c = np.maximum(c, 1e-12)
    hidden = np.where(hides, np.minimum(o * x, share * c[:, None, None]), 0.0)
    model = ga * c[:, None] + np.sum(times * (x - hidden), axis=2)
    sse = np.sum(((model - t) / t) ** 2, axis=1)
    good = np.flatnonzero(sse <= sse.min() + CHI2_95 * noise_variance(usable) + 1e-12)
    best = good[len(good) // 2] if rng is None else rng.choice(good)  # among the overlaps the points cannot tell apart
    return Fit(float(c[best]), float(OVERLAP_GRID[best]), net,
               (float(OVERLAP_GRID[good[0]]), float(OVERLAP_GRID[good[-1]])))


# --- extrapolation with its band -------------------------------------------------------------------------
@dataclass(frozen=True)
class Extrapolation:
    """One configuration's DP curve under one source: nominal, band, knee and how far past the measured range."""

    config: str
    source: str
    kind: str
    """`sweep`, `profile` or `published`."""
    dps: tuple[int, ...]
    tokens_per_s_per_gpu: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    efficiency: tuple[float, ...]
    measured: dict[int, float]
    """Measured tokens/s per GPU by dp."""
    threshold: float
    knee_dp: int
    next_dp: Optional[int]
    """First dp whose nominal efficiency is below the threshold (None: none up to the last dp)."""
    next_dp_band: tuple[Optional[int], Optional[int]]
    """The BAND percentiles over the draws of that first dp (None: beyond the last dp)."""
    fit: Fit
    params: dict[str, tuple[float, float, float]]
    """Fitted or given parameters: (nominal, low, high) over the draws."""
    misfit: float
    """Largest relative error of the nominal model's step time at the measured dps."""
    batch: str
    """How the global batch splits over dp (`Workload.batch`)."""
    notes: tuple[str, ...] = field(default=())

    @property
    def max_measured_dp(self) -> int:
        """The largest measured dp."""
        return max(self.measured)

    def knee_sentence(self) -> str:
        """The knee as a range in words, with its band and how far past the measured range it lies."""
        thr = f"{self.threshold:.0%}"
        if self.next_dp is None:
            head = f"efficiency stays ≥ {thr} up to dp={self.dps[-1]}, the last dp it predicts"
        else:
            head = f"efficiency falls below {thr} between dp={self.knee_dp} and dp={self.next_dp}"
        lo, hi = (f"dp={d}" if d is not None else f"beyond dp={self.dps[-1]}" for d in self.next_dp_band)
        band = (f"in {BAND[1] - BAND[0]:.0f}% of the draws the first dp below {thr} is {lo}" if lo == hi else
                f"in {BAND[1] - BAND[0]:.0f}% of the draws the first dp below {thr} lies between {lo} and {hi}")
        past = self.dps[-1] / self.max_measured_dp
        reach = (f"extrapolated from dp ≤ {self.max_measured_dp} to dp={self.dps[-1]}, {past:g}× past the largest "
                 f"measured dp" if past > 1 else f"no dp beyond the measured {self.max_measured_dp} can be predicted")
        return f"{head} ({band}; {reach})"


def _quantiles(values: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(values, BAND, method="nearest")  # nearest: a β of inf (no cost fitted) stays inf
    return float(lo), float(hi)


def _first_below(dps: Sequence[int], eff: np.ndarray, threshold: float) -> Optional[int]:
    return find_knee(list(dps), list(eff), threshold)[1]


def _band_of_first_below(firsts: list[Optional[int]]) -> tuple[Optional[int], Optional[int]]:
    """Percentiles of the first dp below the threshold over the draws (None counts as beyond every dp)."""
    ranked = np.array([f if f is not None else np.inf for f in firsts], dtype=float)
    lo, hi = np.percentile(ranked, BAND, method="nearest")
    return tuple(int(v) if np.isfinite(v) else None for v in (lo, hi))  # type: ignore[return-value]


def grid(w: Workload, measured: Sequence[int], reaches, max_dp: int = MAX_DP) -> list[int]:
    """Measured dps and the powers of two from the smallest to max_dp that split the batch and the network reaches."""
    dp0 = min(measured)
    powers = [2**k for k in range(max_dp.bit_length()) if dp0 <= 2**k <= max_dp]
    return [n for n in sorted({*measured, *powers})
            if n in measured or (w.grad_acc_at(n) is not None and reaches(n))]


def _resample(points: Sequence[Point], rng: np.random.Generator, by_point: bool) -> list[Point]:
    """Each point's timed steps drawn with replacement; the points too when `by_point` (the smallest dp always kept)."""
    chosen = list(points)
    if by_point:
        rest = rng.choice(len(points) - 1, len(points) - 1) + 1
        chosen = [points[0]] + [points[i] for i in sorted(rest)]
    return [Point(p.dp, p.grad_acc, tuple(rng.choice(p.step_times_s, len(p.step_times_s)))) for p in chosen]


def _curve(w: Workload, f: Fit, dps: Sequence[int]) -> np.ndarray:
    return np.array([w.tokens_per_rank(n) / step_time_s(w, f.network, n, f.compute_s, f.overlap) for n in dps])


def _params(f: Fit) -> dict[str, float]:
    out = {"compute_s": f.compute_s, "overlap": f.overlap}
    for tier, ab in f.network.tiers.items():
        out[f"alpha_s {tier}"] = ab.alpha_s
        out[f"beta_bytes_per_s {tier}"] = ab.beta_bytes_per_s
    return out


def extrapolate(config: str, w: Workload, points: Sequence[Point], dpn: Optional[int],
                source: Optional[NetworkEstimate] = None, threshold: float = DEFAULT_THRESHOLD,
                max_dp: int = MAX_DP, n_draws: int = N_DRAWS, seed: int = 0) -> Extrapolation:
    """Fit one configuration's points under a source ((a) when `source` is None) and extrapolate to max_dp."""
    points = sorted(points, key=lambda p: p.dp)
    rng = np.random.default_rng(seed)
    notes: list[str] = []
    design = _design(w, points, dpn)
    full = identifiable(design)
    if source is None:
        free, dropped = resolved_columns(design, np.array([p.step_time_s for p in points]), full,
                                         noise_variance(points))
        nominal = fit_sweep(w, points, dpn, free)
        notes.append(identification(points, dpn, full, dropped))
        reaches = nominal.network.reaches
        by_point = len(points) > len(full) + 1
        label, kind = "fitted to this sweep's DP curve", "sweep"
    else:
        nominal = fit_given(w, points, source.nominal)
        reaches = source.nominal.reaches
        by_point = len(points) > 3
        label, kind = source.label, source.kind
        notes += list(source.notes)
        if any(p.dp >= 2 and reaches(p.dp) for p in points):
            notes.append(overlap_words(nominal))
    dps = grid(w, [p.dp for p in points], reaches, max_dp)
    curves, firsts, params = [], [], []
    for d in range(n_draws):
        data = _resample(points, rng, by_point)
        if source is None and by_point and identifiable(_design(w, data, dpn)) != full:
            data = _resample(points, rng, False)  # these points lose a tier or a parameter: keep every point
        # (a)'s draws refit every column the points identify, an unresolved α too: the band shows what it leaves out
        f = fit_sweep(w, data, dpn, full) if source is None else fit_given(w, data, source.draws[d], rng)
        tps = _curve(w, f, dps)
        curves.append(tps)
        firsts.append(_first_below(dps, tps / tps[0], threshold))
        params.append(_params(f))
    curves_arr = np.array(curves)
    tps = _curve(w, nominal, dps)
    eff = tps / tps[0]
    knee_dp, next_dp = find_knee(dps, list(eff), threshold)
    low, high = np.nanpercentile(curves_arr, BAND, axis=0)
    spread = {k: (v, *_quantiles(np.array([p[k] for p in params]))) for k, v in _params(nominal).items()}
    measured = {p.dp: w.mbs * w.seq_len * p.grad_acc / p.step_time_s for p in points}
    if dps[-1] < max_dp:
        notes.append(_why_it_stops(w, dps[-1], reaches, max_dp))
    misfit = max(abs(step_time_s(w, nominal.network, p.dp, nominal.compute_s, nominal.overlap, p.grad_acc)
                     / p.step_time_s - 1) for p in points if reaches(p.dp))
    if misfit > MISFIT_WARNING:
        notes.insert(0, f"the model misses the measured step times by up to {misfit:.0%}: these points are not "
                        "a curve it can produce (more ranks faster per rank, or noise beyond the timed steps' "
                        "spread), so its extrapolation does not describe this configuration")
    return Extrapolation(config, label, kind, tuple(dps), tuple(tps), tuple(low), tuple(high), tuple(eff), measured,
                         threshold, knee_dp, next_dp, _band_of_first_below(firsts), nominal, spread, misfit,
                         w.batch(), tuple(notes))


def overlap_words(f: Fit) -> str:
    """The fitted overlap and how well the measured points pin it, in words."""
    lo, hi = f.overlap_range
    if hi - lo >= 0.9:
        return (f"the measured points do not resolve the overlap ({lo:.2f} to {hi:.2f} fit alike): the curve takes "
                f"{f.overlap:.2f}, the band draws across the range")
    return f"overlap {f.overlap:.2f} fitted" + (f" ({lo:.2f} to {hi:.2f} fit within the noise)" if hi > lo else "")


def _why_it_stops(w: Workload, last: int, reaches, max_dp: int) -> str:
    nxt = 2 ** last.bit_length()
    if w.gbs is not None and w.grad_acc_at(nxt) is None and nxt <= max_dp:
        return (f"stops at dp={last}: beyond it the fixed global batch of {w.gbs} samples no longer splits into "
                f"micro-batches of mbs={w.mbs}")
    if not reaches(nxt):
        return f"stops at dp={last}: this source has no figures for the tier between nodes"
    return f"stops at dp={last}"


def identification(points: Sequence[Point], dpn: Optional[int], full: list[int], dropped: dict[int, str]) -> str:
    """What the measured points identify of the step model, in words (source (a)): `full` the columns they can
    tell apart, `dropped` those among them set to 0 and why."""
    comm = [p.dp for p in points if p.dp >= 2]
    found, not_found = ["the compute time per micro-step"], []
    measured = {c for p in points for c in range(1, 1 + 2 * len(TIERS))
                if p.dp >= 2 and TIERS[(c - 1) // 2] == tier_of(p.dp, dpn)}
    for i, tier in enumerate(TIERS):
        name = "within a node" if tier == INTRA else "between nodes"
        if 1 + 2 * i not in measured:
            if tier == INTER and dpn is not None:
                not_found.append(f"the tier between nodes (no measured dp spans more than {dpn} ranks)")
            continue
        for col, symbol in ((1 + 2 * i, "β"), (2 + 2 * i, "α")):
            if col in dropped:
                not_found.append(f"{symbol} {name} ({dropped[col]}: {'no cost' if symbol == 'β' else 'set to 0'})")
            elif col in full:
                found.append(f"{symbol} {name}")
            else:
                not_found.append(f"{symbol} {name} (one ring length measured: latency and bandwidth inseparable; "
                                 "set to 0)")
    text = (f"measured dp {', '.join(str(p.dp) for p in points)}: {len(comm)} point(s) with communication identify "
            f"{', '.join(found)}; the overlap cannot be told from the bandwidth, so it is 0 and the figures are those "
            "of exposed communication")
    return text + (f"; not identified: {'; '.join(not_found)}" if not_found else "")


# --- the sweep's table -> workloads and points --------------------------------------------------------------
def workload_and_points(group: pd.DataFrame) -> tuple[Workload, list[Point]]:
    """One configuration of `dp_scaling.scaling_table` as a workload and its measured points."""
    group = group.sort_values("dp")
    last = group.iloc[-1]
    fixed_batch = group["gbs"].nunique(dropna=False) == 1
    reduce = last.get("fsdp_grad_reduce")
    w = Workload(int(last["zero_stage"]), int(last["n_params"]), str(last["precision"]), int(last["mbs"]),
                 int(last["seq_len"]), int(last["gbs"]) if fixed_batch else None,
                 1 if fixed_batch else int(last["grad_acc"]),
                 # records from before the setting existed reduce-scattered on the last micro-step only
                 str(reduce) if isinstance(reduce, str) else LAST)
    points = []
    for _, row in group.iterrows():
        times = row.get("step_times_s")
        times = tuple(float(x) for x in times) if isinstance(times, (list, tuple, np.ndarray)) and len(times) else (
            float(row["step_time_s"]),)
        points.append(Point(int(row["dp"]), int(row["grad_acc"]), times))
    return w, points


def sources(sweep_dir: Path, hardware: str, dpn: Optional[int], n_draws: int = N_DRAWS,
            seed: int = 0) -> tuple[list[Optional[NetworkEstimate]], list[str]]:
    """The sources for a sweep's hardware: (a) always (None), (b) when the sweep has a profile (the tiers it lacks
    from (c)), (c) when the hardware profile has published figures; and notes on what could not be used."""
    rng = np.random.default_rng(seed)
    found: list[Optional[NetworkEstimate]] = [None]
    notes = []
    pub = published_estimate(hardware, dpn, n_draws, rng)
    path = sweep_dir / PROFILE_FILE
    if path.exists():
        try:
            prof = profile_estimate(load_profile(path), dpn, n_draws, rng)
            found.append(with_fallback(prof, pub) if pub else prof)
        except (ValueError, KeyError, TypeError) as e:
            notes.append(f"The measured profile could not be used: {e}.")
    else:
        notes.append(f"No measured profile: `scaling collectives --sweep-dir {sweep_dir}` writes one ({PROFILE_FILE}).")
    if pub:
        found.append(pub)
    else:
        notes.append(f"hardware={hardware} has no published network figures (conf/network/{hardware}.yaml).")
    return found, notes


def sweep_extrapolations(sweep_dir: Path, table: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD,
                         n_configs: int = EXTRAPOLATED_CONFIGS, max_dp: int = MAX_DP, n_draws: int = N_DRAWS
                         ) -> tuple[dict[str, list[Extrapolation]], list[str]]:
    """Every source's extrapolation of the fastest configurations of a `dp_scaling.scaling_table` measured at two
    or more dp; and the notes of `sources`."""
    measured = table.groupby("config")["dp"].nunique()
    fastest = (table[table["config"].isin(measured[measured > 1].index)].groupby("config")["tokens_per_s_per_gpu"]
               .max().nlargest(n_configs).index)
    found: dict[str, list[Extrapolation]] = {}
    notes: list[str] = []
    cache: dict[tuple[str, Optional[int]], tuple[list[Optional[NetworkEstimate]], list[str]]] = {}
    for config in fastest:
        group = table[table["config"] == config]
        hardware = str(group["hardware"].iloc[0])
        dpn = group["devices_per_node"].iloc[0] if "devices_per_node" in group else None
        dpn = None if pd.isna(dpn) else int(dpn)
        if (hardware, dpn) not in cache:
            cache[hardware, dpn] = sources(sweep_dir, hardware, dpn, n_draws)
            notes += [n for n in cache[hardware, dpn][1] if n not in notes]
        w, points = workload_and_points(group)
        found[config] = [extrapolate(config, w, points, dpn, src, threshold, max_dp, n_draws)
                         for src in cache[hardware, dpn][0]]
    return found, notes


LETTERS = {"sweep": "(a)", "profile": "(b)", "published": "(c)"}


def _interval(values: tuple[float, float, float], scale: float, unit: str) -> str:
    nominal, lo, hi = (v / scale for v in values)
    if not np.isfinite(nominal):
        return "no cost fitted"
    unit = f" {unit}" if unit else ""
    return f"{nominal:.3g}{unit}" + (f" [{lo:.3g}, {hi:.3g}]" if hi - lo > 1e-3 * abs(nominal) else "")


def summary_table(found: dict[str, list[Extrapolation]]) -> pd.DataFrame:
    """One row per (configuration, source): reach, knee, its band, and the parameters with their intervals."""
    rows = []
    for results in found.values():
        for r in results:
            band = "–".join(f"{d}" if d is not None else f">{r.dps[-1]}" for d in r.next_dp_band)
            row = {"configuration": r.config, "source": f"{LETTERS[r.kind]} {r.kind}",
                   "measured dp": ", ".join(map(str, r.measured)), "extrapolated to": r.dps[-1],
                   f"first dp < {r.threshold:.0%}": r.next_dp if r.next_dp is not None else f">{r.dps[-1]}",
                   "its band": band, "compute per micro-step": _interval(r.params["compute_s"], 1e-3, "ms"),
                   "overlap": _interval(r.params["overlap"], 1, "")}
            for tier in TIERS:
                if f"alpha_s {tier}" in r.params:
                    row[f"α {tier}"] = _interval(r.params[f"alpha_s {tier}"], 1e-6, "µs")
                    row[f"β {tier}"] = _interval(r.params[f"beta_bytes_per_s {tier}"], 1e9, "GB/s")
                else:
                    row[f"α {tier}"] = row[f"β {tier}"] = "unknown"
            row["misfit at measured dp"] = f"{r.misfit:.1%}"
            rows.append(row)
    return pd.DataFrame(rows)


def report_text(found: dict[str, list[Extrapolation]]) -> list[str]:
    """The knee of each configuration under each source in words, with what the source could identify."""
    out = []
    for config, results in found.items():
        out.append(f"{config}: {results[0].batch}.")
        for r in results:
            text = f"{LETTERS[r.kind]} {r.source}: {r.knee_sentence()}."
            if r.notes:
                text += " " + " ".join(n[0].upper() + n[1:] + "." for n in r.notes)
            out.append(text)
    return out


def plot(results: Sequence[Extrapolation]) -> Figure:
    """One configuration's tokens/s per GPU vs dp: measured points, each source's nominal curve, band and knee."""
    fig = new_figure((8.5, 5.2))
    ax = fig.subplots()
    colors = {"sweep": "tab:blue", "profile": "tab:green", "published": "tab:orange"}
    letters = {"sweep": "(a)", "profile": "(b)", "published": "(c)"}
    for r in results:
        color = colors[r.kind]
        ax.fill_between(r.dps, r.low, r.high, color=color, alpha=0.18, linewidth=0, gid=f"band:{r.kind}")
        ax.plot(r.dps, r.tokens_per_s_per_gpu, color=color, linestyle="--", label=f"{letters[r.kind]} {r.source}")
        at = r.dps.index(r.knee_dp)
        ax.plot([r.knee_dp], [r.tokens_per_s_per_gpu[at]], marker="*", markersize=15, color=color,
                markeredgecolor="black", linestyle="none", gid=f"knee:{r.kind}")
    measured = results[0].measured
    ax.plot(list(measured), list(measured.values()), marker="o", color="black", linestyle="none", label="measured",
            gid="measured")
    ax.axvspan(min(measured), max(measured), color="grey", alpha=0.08, linewidth=0)
    dp_axis(ax, pd.Series(sorted({d for r in results for d in r.dps})))
    ax.set_ylabel("tokens/s per GPU")
    ax.legend(fontsize=7, loc="best")
    thr = f"{results[0].threshold:.0%}"
    ax.set_title(f"{results[0].config}: measured (grey span) and extrapolated; bands = {BAND[0]:g}-{BAND[1]:g}% of "
                 f"the draws,\n★ = last dp with efficiency ≥ {thr}", fontsize=9)
    fig.tight_layout()
    return fig
