"""One configuration's DP curve extrapolated past its measured dp under one source, with its band and knee range.

The uncertainty comes from bootstrap draws: each point's timed steps resampled (and the points themselves,
where more were measured than parameters fitted), refitted (analysis.dp_fit) with the model of the nominal
curve, with the source's network draws: (a)'s draws refit the nominal fit's columns (an α the noise leaves
unresolved among them), (b)'s and (c)'s draw the overlap among the values that fit within the noise. The band is the
2.5th-97.5th percentile of the draws, the knee's range the same percentiles of their knees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from analysis.dp_fit import (
    Fit,
    design,
    fit_given,
    fit_sweep,
    given_columns,
    identifiable,
    identification,
    noise_variance,
    overlap_words,
    resolved_columns,
)
from analysis.dp_scaling import DEFAULT_THRESHOLD, find_knee
from analysis.step_model import Point, Workload
from scaling.store.network import NetworkEstimate

MAX_DP = 1024
BAND = (2.5, 97.5)
"""Percentiles of the draws that bound the band."""
N_DRAWS = 200
MISFIT_WARNING = 0.10
"""A source whose nominal model misses a measured step time by more than this is flagged in the report."""


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
    draws: tuple[Fit, ...] = field(default=(), repr=False)
    """The bootstrap draws' fits, whose percentiles make the band: the same band at any (dp, grad_acc)."""

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
        band = (
            f"in {BAND[1] - BAND[0]:.0f}% of the draws the first dp below {thr} is {lo}"
            if lo == hi
            else f"in {BAND[1] - BAND[0]:.0f}% of the draws the first dp below {thr} lies between {lo} and {hi}"
        )
        past = self.dps[-1] / self.max_measured_dp
        reach = (
            f"extrapolated from dp ≤ {self.max_measured_dp} to dp={self.dps[-1]}, {past:g}× past the largest "
            f"measured dp"
            if past > 1
            else f"no dp beyond the measured {self.max_measured_dp} can be predicted"
        )
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


def grid(w: Workload, measured: Sequence[int], reaches: Callable[[int], bool], max_dp: int = MAX_DP) -> list[int]:
    """Measured dps and the powers of two from the smallest to max_dp that split the batch and the network reaches."""
    dp0 = min(measured)
    powers = [2**k for k in range(max_dp.bit_length()) if dp0 <= 2**k <= max_dp]
    return [n for n in sorted({*measured, *powers}) if n in measured or (w.grad_acc_at(n) is not None and reaches(n))]


def _resample(points: Sequence[Point], rng: np.random.Generator, by_point: bool) -> list[Point]:
    """Each point's timed steps drawn with replacement; the points too when `by_point` (the smallest dp always kept)."""
    chosen = list(points)
    if by_point:
        rest = rng.choice(len(points) - 1, len(points) - 1) + 1
        chosen = [points[0]] + [points[i] for i in sorted(rest)]
    return [Point(p.dp, p.grad_acc, tuple(rng.choice(p.step_times_s, len(p.step_times_s)))) for p in chosen]


def _curve(w: Workload, f: Fit, dps: Sequence[int]) -> np.ndarray:
    return np.array([w.tokens_per_rank(n) / f.step_time_s(w, n) for n in dps])


def _params(f: Fit) -> dict[str, float]:
    out = {"compute_s": f.compute_s, "optimizer_s_per_param": f.optimizer_s_per_param, "overlap": f.overlap}
    for tier, ab in f.network.tiers.items():
        out[f"alpha_s {tier}"] = ab.alpha_s
        out[f"beta_bytes_per_s {tier}"] = ab.beta_bytes_per_s
    return out


def extrapolate(
    config: str,
    w: Workload,
    points: Sequence[Point],
    dpn: Optional[int],
    source: Optional[NetworkEstimate] = None,
    threshold: float = DEFAULT_THRESHOLD,
    max_dp: int = MAX_DP,
    n_draws: int = N_DRAWS,
    seed: int = 0,
) -> Extrapolation:
    """Fit one configuration's points under a source ((a) when `source` is None) and extrapolate to max_dp."""
    points = sorted(points, key=lambda p: p.dp)
    rng = np.random.default_rng(seed)
    notes: list[str] = []
    if source is None:
        d = design(w, points, dpn)
        full = identifiable(d)
        free, open_ = resolved_columns(d, np.array([p.step_time_s for p in points]), full, noise_variance(points))
        nominal = fit_sweep(w, points, dpn, free)
        notes.append(identification(points, dpn, full, open_))
        reaches = nominal.network.reaches
        by_point = len(points) > len(free) + 1
        needed = full  # a draw that loses a measured tier or a parameter cannot be fitted with the nominal's columns
        label, kind = "fitted to this sweep's DP curve", "sweep"
    else:
        free = given_columns(w, points, source.nominal)
        nominal = fit_given(w, points, source.nominal, free)
        reaches = source.nominal.reaches
        by_point = len(points) > len(free) + 2  # the overlap too
        needed = free
        label, kind = source.label, source.kind
        notes += list(source.notes)
        if any(p.dp >= 2 and reaches(p.dp) for p in points):
            notes.append(overlap_words(nominal))
    dps = grid(w, [p.dp for p in points], reaches, max_dp)
    curves, firsts, params, fits = [], [], [], []
    for i in range(n_draws):
        data = _resample(points, rng, by_point)
        if by_point and not set(needed) <= set(identifiable(design(w, data, dpn))):
            data = _resample(points, rng, False)  # these points lose a tier or a parameter: keep every point
        f = fit_sweep(w, data, dpn, free) if source is None else fit_given(w, data, source.draws[i], free, rng)
        fits.append(f)
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
    misfit = max(abs(nominal.step_time_s(w, p.dp, p.grad_acc) / p.step_time_s - 1) for p in points if reaches(p.dp))
    if misfit > MISFIT_WARNING:
        notes.insert(
            0,
            f"the model misses the measured step times by up to {misfit:.0%}: these points are not "
            "a curve it can produce (more ranks faster per rank, or noise beyond the timed steps' "
            "spread), so its extrapolation does not describe this configuration",
        )
    return Extrapolation(
        config,
        label,
        kind,
        tuple(dps),
        tuple(tps),
        tuple(low),
        tuple(high),
        tuple(eff),
        measured,
        threshold,
        knee_dp,
        next_dp,
        _band_of_first_below(firsts),
        nominal,
        spread,
        misfit,
        w.batch(),
        tuple(notes),
        tuple(fits),
    )


def _why_it_stops(w: Workload, last: int, reaches: Callable[[int], bool], max_dp: int) -> str:
    nxt = 2 ** last.bit_length()
    if w.gbs is not None and w.grad_acc_at(nxt) is None and nxt <= max_dp:
        return (
            f"stops at dp={last}: beyond it the fixed global batch of {w.gbs} samples no longer splits into "
            f"micro-batches of mbs={w.mbs}"
        )
    if not reaches(nxt):
        return f"stops at dp={last}: this source has no figures for the tier between nodes"
    return f"stops at dp={last}"
