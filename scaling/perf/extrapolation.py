"""One configuration's DP curve extrapolated past its measured dp under one source, with its band and knee range.

`extrapolate` fits the step model (scaling.perf.dp_fit) and draws its bootstrap band: each draw carries the fit's
doubt (timed steps resampled, a run-to-run factor `RUN_TO_RUN`, the source's network draws) and the model form's
(`ModelForm`: past the largest measured dp, communication and optimizer time off by (1 + κ) per doubling, a
straggler; priors `OVERHEAD_PER_DOUBLING`, `STRAGGLER`) and the target's own scatter around the curve
(`target_scatter`: the fit's residuals, at least `RUN_TO_RUN`). The band is the 2.5th-97.5th percentile of the draws, the
knee's range the same of their knees; past the horizon (`HORIZON` × the largest dp measured points or a measured
network reach) no figure is given. The reasoning and its checks: docs/dp-extrapolation.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from scaling.perf.dp_fit import (
    Column,
    Fit,
    Term,
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
from scaling.perf.knee import DEFAULT_THRESHOLD, find_knee, stops_paying_off
from scaling.perf.network import INTER, INTRA, AlphaBeta, Network, NetworkEstimate, tier_of
from scaling.perf.network_figures import N_DRAWS
from scaling.perf.step_model import Point, Workload, step_time_s

MAX_DP = 1024
BAND = (2.5, 97.5)
"""Percentiles of the draws that bound the band."""
MISFIT_WARNING = 0.10
"""A source whose nominal model misses a measured step time by more than this is flagged in the report."""
RUN_TO_RUN = 0.02
"""Relative standard deviation of a point's step time between launches (another allocation, another day) that the
timed steps of one launch cannot show: drawn once per point into every bootstrap draw. A published figure has no
timed steps at all; this is its only spread. Also the prior of the target's own scatter (`target_scatter`)."""
OVERHEAD_PER_DOUBLING = (-0.15, 0.4)
"""Prior of κ (uniform): per doubling past the largest measured dp, the step model's communication and optimizer
time is off by a factor (1 + κ). Up to +40%: a third network tier at half the bandwidth crossed within two
doublings (+41% per doubling), or congestion that costs 10-20% more per doubling of the ring; down to -15%: a
network that scales better than its measured tiers. The upper bound is the one of +35/40/50% that scores best
(the mean interval score of every cell of `bench_extrapolation.py --coverage` lower than at +50%) while every cell
holds ≥ 90% of its truths (+35%: 86-88% of the mismatched ones): benchmarks/RESULTS.md."""
STRAGGLER = (0.0, 0.03)
"""Prior of the straggler spread s (uniform): each rank's compute per step varies by s relative, so a step of n
ranks waits for the slowest, √(2 ln n)·s above the mean; past the largest measured dp the compute grows by the
difference."""
ALPHA_PRIOR = {INTRA: (0.0, 5e-6), INTER: (0.0, 20e-6)}
"""Prior (uniform) of a ring step's latency in seconds where the measured dp leave it open (source (a) sets it to 0
in the curve): the span of the published ranges, NVLink or PCIe within a node, InfiniBand or RoCE between nodes
(conf/network/*.yaml)."""
HORIZON = 4
"""No figure past this many times the largest dp the measured points (or a measured network profile) reach."""


def target_scatter(residuals: Sequence[float], n_params: int, prior: float = RUN_TO_RUN) -> float:
    """Relative standard deviation of the figure a held-out count will show around the curve (a launch's run-to-run,
    a published table's row-to-row): the nominal fit's relative residuals at the measured points over their degrees
    of freedom, never below `prior`, which is all there is with no more points than parameters (one point per count:
    nothing tells scatter from the curve)."""
    dof = len(residuals) - n_params
    if dof < 1:
        return prior
    return max(prior, math.sqrt(sum(r * r for r in residuals) / dof))


def launch_scatter(launches: Iterable[Sequence[float]], prior: float = RUN_TO_RUN) -> float:
    """Relative standard deviation of a point's step time between its launches (each group: one point's launches,
    each a launch's step time), pooled over the points with two launches or more; never below `prior`, which is
    all there is without a repeated launch."""
    squares, dof = 0.0, 0
    for group in launches:
        logs = [math.log(t) for t in group]
        if len(logs) > 1:
            mean = sum(logs) / len(logs)
            squares += sum((v - mean) ** 2 for v in logs)
            dof += len(logs) - 1
    return max(prior, math.sqrt(squares / dof)) if dof else prior


def _max_of(n: int) -> float:
    """Expected maximum of n standard normal draws (≈ √(2 ln n)), 0 at n=1."""
    return math.sqrt(2 * math.log(n)) if n > 1 else 0.0


@dataclass(frozen=True)
class ModelForm:
    """What the measured points cannot identify, as one draw: 0 at every dp up to `measured`, growing past it."""

    measured: int
    """The largest measured dp."""
    kappa: float = 0.0
    """Communication and optimizer time × (1 + κ) per doubling past `measured`."""
    straggler: float = 0.0
    """Relative spread of a rank's compute: the slowest of n ranks sets the step."""
    last_tier: bool = False
    """κ scales only the tier a ring of that size crosses last (a network given by a profile or published figures,
    whose tiers within a node hold for any ring), not every tier (source (a), whose figures within a node are
    fitted on short rings)."""

    def scale(self, n: int) -> tuple[float, float]:
        """(factor on the communication and optimizer time, factor on the compute) at dp=n."""
        if n <= self.measured:
            return 1.0, 1.0
        doublings = math.log2(n / self.measured)
        return (1 + self.kappa) ** doublings, 1 + self.straggler * (_max_of(n) - _max_of(self.measured))


def _scaled(net: Network, k: float, tier: Optional[str] = None) -> Network:
    """The collectives of `tier` (None: of every tier) k times slower: α × k, β / k."""
    return replace(
        net,
        tiers={
            t: AlphaBeta(ab.alpha_s * k, ab.beta_bytes_per_s / k) if tier in (None, t) else ab
            for t, ab in net.tiers.items()
        },
    )


@dataclass(frozen=True)
class Draw:
    """One bootstrap draw: a fit of resampled points and a draw of the model's form."""

    fit: Fit
    form: ModelForm
    scatter: float = 0.0
    """The target's own relative deviation from the curve in this draw (its step time × (1 + scatter)): drawn from
    `target_scatter`, the same at every dp (it moves the band at each count, not the knee)."""

    @property
    def network(self) -> Network:
        """The draw's network figures."""
        return self.fit.network

    def step_time_s(self, w: Workload, n: int, grad_acc: Optional[int] = None) -> float:
        """The draw's seconds per step at dp=n: its fit's step model with the form's factors past the measured dp."""
        comm, compute = self.form.scale(n)
        if comm == compute == 1.0:
            return self.fit.step_time_s(w, n, grad_acc) * (1 + self.scatter)
        f = self.fit
        net = _scaled(f.network, comm, tier_of(n, f.network.devices_per_node) if self.form.last_tier else None)
        seconds = step_time_s(w, net, n, f.compute_s * compute, f.overlap, f.optimizer_s_per_param * comm, grad_acc)
        return seconds * (1 + self.scatter)


def rate_band(
    w: Workload, nominal: Fit, draws: Sequence[Draw], n: int, grad_acc: int
) -> tuple[float, float, float, float]:
    """At dp=n and `grad_acc`: the nominal fit's seconds per step and tokens/s per GPU, and the BAND percentiles of
    the tokens/s per GPU of the draws whose network reaches n (the nominal figure, when none does)."""
    layout = w.layout_at(n)
    tokens = layout.per_gpu(w.mbs * w.seq_len * grad_acc)  # a GPU's share of its dp rank's tokens
    step = nominal.step_time_s(w, n, grad_acc)
    rates = [tokens / d.step_time_s(w, n, grad_acc) for d in draws if d.network.reaches(layout.world_size)]
    lo, hi = (float(v) for v in np.percentile(rates, BAND)) if rates else (tokens / step, tokens / step)
    return step, tokens / step, lo, hi


WIDE = 0.25
"""A band whose half-width exceeds this (relative to its figure) names the unknown that makes it wide."""


def wide_because(w: Workload, nominal: Fit, draws: Sequence[Draw], n: int, grad_acc: int) -> Optional[str]:
    """Why the band at dp=n is wider than WIDE, in words (None: it is not): the model form past the measured dp
    when the draws without it are less than half as wide, else the fit of the measured points."""
    _, rate, lo, hi = rate_band(w, nominal, draws, n, grad_acc)
    if (hi - lo) / 2 / rate <= WIDE:
        return None
    bare = [Draw(d.fit, ModelForm(d.form.measured)) for d in draws]
    _, _, flo, fhi = rate_band(w, nominal, bare, n, grad_acc)
    half, fitted = (hi - lo) / 2 / rate, (fhi - flo) / 2 / rate
    if fitted <= half / 2:
        return (
            f"the band at dp={n} (±{half:.0%}) is wide mostly because of the network and the optimizer past the "
            f"largest measured dp, {draws[0].form.measured} (a tier or congestion no measured ring crossed: "
            f"{OVERHEAD_PER_DOUBLING[0]:+.0%} to {OVERHEAD_PER_DOUBLING[1]:+.0%} per doubling); without it ±{fitted:.0%}: "
            "measure a larger dp, or the network there (`scaling collectives`)"
        )
    return f"the band at dp={n} (±{half:.0%}) is wide mostly because of the fit of the measured points (±{fitted:.0%} alone)"


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
    horizon: int = MAX_DP
    """The largest dp given a figure (HORIZON × the largest dp the measurements reach)."""
    horizon_reason: str = ""
    """Why there is no figure past the horizon, in words."""
    notes: tuple[str, ...] = field(default=())
    draws: tuple[Draw, ...] = field(default=(), repr=False)
    """The bootstrap draws, whose percentiles make the band: the same band at any (dp, grad_acc)."""

    @property
    def max_measured_dp(self) -> int:
        """The largest measured dp."""
        return max(self.measured)

    def within(self, dp: int) -> bool:
        """Whether dp lies within the horizon (a figure is given)."""
        return dp <= self.horizon

    @property
    def last_dp(self) -> int:
        """The last dp given a figure."""
        return max(d for d in self.dps if self.within(d))

    def knee_sentence(self) -> str:
        """The knee as a range in words, with its band and how far past the measured range it lies."""
        thr = f"{self.threshold:.0%}"
        last = self.last_dp
        head = stops_paying_off(self.next_dp, self.threshold, f"dp={self.dps[0]}", last, lambda d: f"dp={d}")
        if self.next_dp is None:
            head += ", the last dp it predicts" + (f" ({self.horizon_reason})" if last < self.dps[-1] else "")
        lo, hi = (f"dp={d}" if d is not None else f"beyond dp={last}" for d in self.next_dp_band)
        band = (
            f"in {BAND[1] - BAND[0]:.0f}% of the draws the first dp below {thr} is {lo}"
            if lo == hi
            else f"in {BAND[1] - BAND[0]:.0f}% of the draws the first dp below {thr} lies between {lo} and {hi}"
        )
        past = last / self.max_measured_dp
        reach = (
            f"extrapolated from dp ≤ {self.max_measured_dp} to dp={last}, {past:g}× past the largest measured dp"
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
    """Measured dps and the powers of two from the smallest to max_dp that the network reaches, each where the batch
    splits into whole micro-steps (a point measured at a rounded split, as the recipe runs a batch of a prime number
    of sequences, has no place on the fixed batch's curve)."""
    dp0 = min(measured)
    powers = [2**k for k in range(max_dp.bit_length()) if dp0 <= 2**k <= max_dp]
    return [n for n in sorted({*measured, *powers}) if w.grad_acc_at(n) is not None and (n in measured or reaches(n))]


def _resample(points: Sequence[Point], rng: np.random.Generator, by_point: bool) -> list[Point]:
    """Each point's timed steps drawn with replacement; the points too when `by_point` (the smallest dp always kept)."""
    chosen = list(points)
    if by_point:
        rest = rng.choice(len(points) - 1, len(points) - 1) + 1
        chosen = [points[0]] + [points[i] for i in sorted(rest)]
    return [Point(p.dp, p.grad_acc, tuple(rng.choice(p.step_times_s, len(p.step_times_s)))) for p in chosen]


def _curve(w: Workload, f: Fit | Draw, dps: Sequence[int]) -> np.ndarray:
    return np.array([w.tokens_per_rank(n) / f.step_time_s(w, n) for n in dps])


def _jittered(points: Sequence[Point], rng: np.random.Generator, spread: float) -> list[Point]:
    """Each point's timed steps moved together by one run-to-run factor."""
    return [Point(p.dp, p.grad_acc, tuple(t * (1 + rng.normal(0, spread)) for t in p.step_times_s)) for p in points]


def _with_latency(f: Fit, alpha_s: dict[str, float]) -> Fit:
    """The fit with the latency of the tiers the points left open drawn in (their bandwidth as fitted)."""
    tiers = {t: AlphaBeta(alpha_s[t], ab.beta_bytes_per_s) if t in alpha_s else ab for t, ab in f.network.tiers.items()}
    return replace(f, network=replace(f.network, tiers=tiers))


def model_form(measured: int, rng: np.random.Generator, last_tier: bool = False) -> ModelForm:
    """A draw of what the measured points cannot identify, from the stated priors."""
    return ModelForm(measured, float(rng.uniform(*OVERHEAD_PER_DOUBLING)), float(rng.uniform(*STRAGGLER)), last_tier)


def horizon(measured: int, source: Optional[NetworkEstimate]) -> tuple[int, str]:
    """The largest dp given a figure, and why none past it: HORIZON × the largest dp the measured points or the
    source's measured network profile reach."""
    reach = max(measured, source.measured_up_to or 0) if source is not None else measured
    what = (
        f"the largest ring its network profile measured, {reach}"
        if reach > measured
        else f"the largest measured dp, {measured}"
    )
    limit = HORIZON * reach
    return limit, (
        f"past dp={limit}, {HORIZON}× {what}, the rings cross what nothing measured (another network tier, "
        "congestion): no figure is given"
    )


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
    run_to_run: float = RUN_TO_RUN,
    model_form_doubt: bool = True,
) -> Extrapolation:
    """Fit one configuration's points under a source ((a) when `source` is None) and extrapolate to max_dp.
    `run_to_run=0` and `model_form_doubt=False` leave the band to the bootstrap of the timed steps alone (the band
    before model-form uncertainty, kept for the benchmark's comparison)."""
    points = sorted(points, key=lambda p: p.dp)
    rng = np.random.default_rng(seed)
    form_rng = np.random.default_rng([seed, 1])  # its own stream: the fit's draws stay what they were
    scatter_rng = np.random.default_rng([seed, 2])  # and the target's scatter its own
    top = max(p.dp for p in points)
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
        unknown = [t for t in nominal.network.tiers if Column(Term.ALPHA, t) not in free]
    else:
        free = given_columns(w, points, source.nominal)
        nominal = fit_given(w, points, source.nominal, free)
        reaches = source.nominal.reaches
        by_point = len(points) > len(free) + 2  # the overlap too
        needed = free
        label, kind = source.label, source.kind
        unknown = []
        notes += list(source.notes)
        if any(p.dp >= 2 and reaches(p.dp) for p in points):
            notes.append(overlap_words(nominal))
    dps = grid(w, [p.dp for p in points], reaches, max_dp)
    limit, limit_reason = horizon(top, source)
    shown = [d for d in dps if d <= limit]
    curves, firsts, params, draws = [], [], [], []
    residuals = [nominal.step_time_s(w, p.dp, p.grad_acc) / p.step_time_s - 1 for p in points if reaches(p.dp)]
    sigma = target_scatter(residuals, len(free) + (source is not None), run_to_run) if run_to_run > 0 else 0.0
    for i in range(n_draws):
        data = _resample(points, rng, by_point)
        if by_point and not set(needed) <= set(identifiable(design(w, data, dpn))):
            data = _resample(points, rng, False)  # these points lose a tier or a parameter: keep every point
        data = _jittered(data, form_rng, run_to_run)
        f = fit_sweep(w, data, dpn, free) if source is None else fit_given(w, data, source.draws[i], free, rng)
        if model_form_doubt and unknown:
            f = _with_latency(f, {t: float(form_rng.uniform(*ALPHA_PRIOR[t])) for t in unknown})
        form = model_form(top, form_rng, source is not None) if model_form_doubt else ModelForm(top)
        d = Draw(f, form, float(scatter_rng.normal(0.0, sigma)) if sigma > 0 else 0.0)
        draws.append(d)
        tps = _curve(w, d, dps)
        curves.append(tps)
        firsts.append(_first_below(shown, tps[: len(shown)] / tps[0], threshold))
        params.append(_params(f))
    curves_arr = np.array(curves)
    tps = _curve(w, nominal, dps)
    eff = tps / tps[0]
    knee_dp, next_dp = find_knee(shown, list(eff[: len(shown)]), threshold)
    low, high = np.nanpercentile(curves_arr, BAND, axis=0)
    spread = {k: (v, *_quantiles(np.array([p[k] for p in params]))) for k, v in _params(nominal).items()}
    measured = {p.dp: w.layout_at(p.dp).per_gpu(w.mbs * w.seq_len * p.grad_acc) / p.step_time_s for p in points}
    if dps[-1] < max_dp and dps[-1] <= limit:
        notes.append(_why_it_stops(w, dps[-1], reaches, max_dp))
    last = shown[-1]
    why = wide_because(w, nominal, draws, last, w.grad_acc_at(last) or 1) if last > top else None
    notes += [why] if why else []
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
        limit,
        limit_reason,
        tuple(notes),
        tuple(draws),
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
