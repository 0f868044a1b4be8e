"""The step model (scaling.perf.step_model) fitted to one configuration's measured points, under one source.

(a) "sweep": the compute time, the optimizer's time per parameter and whatever α-β figures the measured dp identify
(no overlap: exposed communication); (b) "profile" and (c) "published": the network given with its spread, the
compute, the optimizer and the overlap fitted. Without overlap the step time is linear in (a)'s parameters: one named
design column per parameter (`COLUMNS`), solved in relative error by scipy's `lsq_linear` with every coefficient
bounded at 0. The equations: docs/dp-extrapolation.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import lsq_linear

from scaling.perf.network import INTER, INTRA, TIERS, AlphaBeta, Network, latency_steps, ring_cost, tier_of
from scaling.perf.step_model import Point, Workload, comm_windows, step_collectives, step_time_s

OVERLAP_GRID = np.linspace(0.0, 1.0, 101)
CHI2_95 = 3.84


class Term(Enum):
    """What a design column's coefficient is."""

    COMPUTE = "compute_s"
    OPTIMIZER = "optimizer_s_per_param"
    INV_BETA = "1/β"
    ALPHA = "α"


@dataclass(frozen=True)
class Column:
    """One column of the design: a parameter of the step model and the tier it belongs to (None: not the network)."""

    term: Term
    tier: Optional[str] = None

    def beside(self, term: Term) -> Column:
        """The column of `term` in the same tier."""
        return Column(term, self.tier)


COMPUTE, OPTIMIZER = Column(Term.COMPUTE), Column(Term.OPTIMIZER)
COLUMNS = (COMPUTE, *(Column(term, tier) for term in (Term.INV_BETA, Term.ALPHA) for tier in TIERS), OPTIMIZER)
"""The design's columns in order of priority: the compute per micro-step, every tier's 1/β before any α (the bytes a
data-parallel step moves are most of its communication; a ring's latency tells only at ring lengths and call counts
the smallest sweeps do not reach), then the optimizer per parameter updated. With fewer measured dp than columns
the points keep the bandwidths and leave the latencies at 0 (measured at dp 8, 16 and 32 alone: the compute and
both tiers' 1/β, not an α within a node that would carry every byte the rings between nodes moved). The optimizer
comes last because a DP curve seldom tells it apart: at ZeRO-0 it is a constant per step, which the compute (∝ 1/dp)
and each tier's bandwidth term (∝ 1 − 1/dp) add up to; at ZeRO-2/3 it shrinks as 1/dp, as the compute does."""


@dataclass(frozen=True)
class Design:
    """The step times with no overlap, linear in the parameters of COLUMNS."""

    matrix: np.ndarray
    """(point, COLUMNS): seconds per unit of each parameter."""

    def of(self, cols: Sequence[Column]) -> np.ndarray:
        """The matrix restricted to `cols`, in that order: (point, len(cols))."""
        return self.matrix[:, [COLUMNS.index(c) for c in cols]]


def design(w: Workload, points: Sequence[Point], dpn: Optional[int]) -> Design:
    """Each point's grad_acc (the compute's multiplier), the parameters its busiest rank updates (the optimizer's),
    the bytes its step's collectives move at their slowest tier, and their ring steps at each tier's α."""
    rows = []
    for p in points:
        row = dict.fromkeys(COLUMNS, 0.0)
        row[COMPUTE] = float(p.grad_acc)
        row[OPTIMIZER] = float(w.params_updated(p.dp))
        if p.dp >= 2:
            for call in step_collectives(w, p.dp, p.grad_acc):
                ranks, per_node = w.ring(call.group, p.dp, dpn)
                if ranks < 2:
                    continue
                _, moved = ring_cost(call.op, ranks, call.bytes_per_call)
                row[Column(Term.INV_BETA, tier_of(ranks, per_node))] += call.count * moved
                for at, steps in latency_steps(call.op, ranks, per_node).items():
                    row[Column(Term.ALPHA, at)] += call.count * steps
        rows.append([row[c] for c in COLUMNS])
    return Design(np.asarray(rows, dtype=float).reshape(len(rows), len(COLUMNS)))


def identifiable(d: Design, cols: Sequence[Column] = COLUMNS) -> list[Column]:
    """Columns among `cols` the points can tell apart, in order of priority (that of `cols`)."""
    free: list[Column] = []
    for c in cols:
        if not d.of([c]).any():
            continue
        trial = d.of([*free, c])
        trial = trial / np.linalg.norm(trial, axis=0)
        if np.linalg.matrix_rank(trial, tol=1e-9) == len(free) + 1:
            free.append(c)
    return free


def solve(d: Design, t: np.ndarray, cols: Sequence[Column]) -> tuple[dict[Column, float], list[Column]]:
    """Least squares in relative error over `cols`, every coefficient bounded to [0, inf): the coefficient of each
    column (0 outside `cols`) and the columns the bound holds at 0."""
    x = d.of(cols) / t[:, None]
    norms = np.linalg.norm(x, axis=0)  # unit columns: 1/β and α differ by ten orders of magnitude
    res = lsq_linear(x / norms, np.ones_like(t), bounds=(0.0, np.inf), method="bvls")
    coef = dict.fromkeys(COLUMNS, 0.0)
    coef.update({c: float(v / s) for c, v, s in zip(cols, res.x, norms)})
    return coef, [c for c, active in zip(cols, res.active_mask) if active]


@dataclass(frozen=True)
class Fit:
    """Fitted parameters of one configuration under one source."""

    compute_s: float
    optimizer_s_per_param: float
    """Seconds of the optimizer step per parameter the busiest rank updates (clipping's pass included)."""
    overlap: float
    network: Network
    overlap_range: tuple[float, float] = (0.0, 0.0)
    """Overlap values the points cannot tell from the best: squared relative error within the 95% bound of
    one parameter (χ² of 3.84) at the noise of the medians."""

    def step_time_s(self, w: Workload, n: int, grad_acc: Optional[int] = None) -> float:
        """The step model's seconds per step at dp=n under these parameters (scaling.perf.step_model.step_time_s)."""
        return step_time_s(w, self.network, n, self.compute_s, self.overlap, self.optimizer_s_per_param, grad_acc)


def standard_errors(x: np.ndarray, var: float) -> np.ndarray:
    """Standard error of each coefficient of the relative-error least squares x·coef ≈ 1 (x: the design over the
    step times) at a residual variance `var`."""
    norms = np.linalg.norm(x, axis=0)  # the same in unit columns, and better conditioned
    return np.sqrt(np.maximum(np.diag(np.linalg.pinv((x / norms).T @ (x / norms))) * var, 0.0)) / norms


def resolved_columns(
    d: Design, t: np.ndarray, full: Sequence[Column], noise_var: float
) -> tuple[list[Column], dict[Column, str]]:
    """The columns source (a) fits, nominal curve and bootstrap draws alike, and what the points leave open.

    Every column the points identify is fitted, bounded to [0, inf), but the optimizer's when it does not stand out
    of the timing noise (|t| < 2): it is then left to the compute and the bandwidth terms, which carry a constant
    per step between them. The notes say which figures the bound holds at 0 and which α the noise leaves
    unresolved (it and its tier's β not both at |t| ≥ 2): such an α is kept, since setting it to 0 would drop the
    latency that each bucket's and each tensor's call pays again at every larger ring, and the band shows how far
    it may move the curve."""

    def fitted(cols: list[Column]) -> tuple[list[Column], dict[Column, float]]:
        """The columns the bound holds at 0, and the t statistic of each."""
        coef, at_zero = solve(d, t, cols)
        x, values = d.of(cols) / t[:, None], np.array([coef[c] for c in cols])
        resid = x @ values - 1
        var = max(noise_var, float(resid @ resid) / (len(t) - len(cols)) if len(t) > len(cols) else 0.0)
        se = standard_errors(x, var)
        return at_zero, dict(zip(cols, np.where(se > 0, values / np.where(se > 0, se, 1.0), np.inf)))

    cols, notes = list(full), {}
    at_zero, stat = fitted(cols)
    if OPTIMIZER in cols and (OPTIMIZER in at_zero or stat[OPTIMIZER] < 2):
        cols.remove(OPTIMIZER)
        notes[OPTIMIZER] = (
            "fitted below 0"
            if OPTIMIZER in at_zero
            else f"not resolved above the timing noise (t = {stat[OPTIMIZER]:.1f})"
        )
        at_zero, stat = fitted(cols)
    for c in cols:
        t_alpha = min(stat[c], stat.get(c.beside(Term.INV_BETA), 0.0))
        if c in at_zero and c != COMPUTE:
            notes[c] = "held at 0 by the bound"
        elif c.term is Term.ALPHA and t_alpha < 2:
            notes[c] = (
                f"not resolved above the timing noise (t = {t_alpha:.1f}): fitted all the same, the band draws it"
            )
    return cols, notes


def fit_sweep(w: Workload, points: Sequence[Point], dpn: Optional[int], free: Sequence[Column]) -> Fit:
    """Source (a): compute_s, the optimizer's and the α-β figures of the free columns, no overlap (the figures are
    those of exposed communication); a tier measured but not resolved costs nothing."""
    d = design(w, points, dpn)
    coef, _ = solve(d, np.array([p.step_time_s for p in points]), free)
    tiers = {}
    for tier in TIERS:
        inv_beta, alpha = Column(Term.INV_BETA, tier), Column(Term.ALPHA, tier)
        if d.of([inv_beta, alpha]).any():  # measured: what was not resolved costs nothing
            tiers[tier] = AlphaBeta(coef[alpha], 1.0 / coef[inv_beta] if coef[inv_beta] > 0 else float("inf"))
    return Fit(coef[COMPUTE], coef[OPTIMIZER], 0.0, Network(tiers, dpn))


def noise_variance(points: Sequence[Point]) -> float:
    """Pooled variance of the relative error of a point's median step time, from the spread of its timed steps."""
    variances = [
        np.var(p.step_times_s, ddof=1) / p.step_time_s**2 * np.pi / (2 * len(p.step_times_s))
        for p in points
        if len(p.step_times_s) > 1
    ]
    return float(np.mean(variances)) if variances else 0.0


def _compute_and_optimizer(
    a: np.ndarray, u: Optional[np.ndarray], r: np.ndarray, t: np.ndarray, c0: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a (overlap, point): compute_s and optimizer_s_per_param ≥ 0 minimising Σ((a·c + u·k − r)/t)²;
    k = 0 when `u` is None, c kept at c0 where the compute has no weight left (all of it saturated)."""
    wt = 1 / t**2
    saa, sar = np.sum(a * a * wt, axis=1), np.sum(a * r * wt, axis=1)
    c_only = np.where(saa > 0, sar / np.where(saa > 0, saa, 1.0), c0)
    if u is None:
        return np.maximum(c_only, 1e-12), np.zeros_like(c_only)
    sau, suu, sur = np.sum(a * u * wt, axis=1), np.sum(u * u * wt), np.sum(u * r * wt, axis=1)
    det = saa * suu - sau**2
    ok = det > 1e-12 * saa * suu
    c = np.where(ok, (sar * suu - sur * sau) / np.where(ok, det, 1.0), c_only)
    k = np.where(ok, (saa * sur - sau * sar) / np.where(ok, det, 1.0), 0.0)
    c, k = np.where(k < 0, c_only, c), np.maximum(k, 0.0)  # the optimizer held at 0: the compute alone
    k = np.where(c <= 0, np.maximum(sur / suu, 0.0), k)  # the compute held at 0: the optimizer alone
    return np.maximum(c, 1e-12), k


def given_columns(w: Workload, points: Sequence[Point], net: Network) -> list[Column]:
    """The columns sources (b) and (c) fit beside the overlap: the compute, and the optimizer where the points the
    network reaches tell it from the compute by more than twice their timing noise (the part of its column, in
    relative error and unit norm, that the compute's cannot reproduce). Short of that, its fitted value would be
    the noise divided by that part, and extrapolated wherever the parameters a rank updates stop shrinking."""
    usable = [p for p in points if net.reaches(p.dp)]
    d = design(w, usable, net.devices_per_node)
    cols = identifiable(d, (COMPUTE, OPTIMIZER))
    if OPTIMIZER not in cols:
        return cols
    x = d.of(cols) / np.array([p.step_time_s for p in usable])[:, None]
    x /= np.linalg.norm(x, axis=0)
    apart = np.linalg.norm(x[:, 1] - (x[:, 1] @ x[:, 0]) * x[:, 0])
    return cols if apart > 2 * np.sqrt(noise_variance(usable)) else [COMPUTE]


def fit_given(
    w: Workload,
    points: Sequence[Point],
    net: Network,
    free: Sequence[Column],
    rng: Optional[np.random.Generator] = None,
) -> Fit:
    """Sources (b) and (c): the network is given; compute_s, the optimizer's time per parameter (when OPTIMIZER is
    among the `free` columns, else 0) and the overlap fitted (overlap on a grid of 0.01: the middle of the values
    that fit within the noise, or one of them drawn at random when `rng` is given)."""
    usable = [p for p in points if net.reaches(p.dp)]
    t = np.array([p.step_time_s for p in usable])
    ga = np.array([float(p.grad_acc) for p in usable])
    updated = np.array([float(w.params_updated(p.dp)) for p in usable])
    # per point and window: how many the step has, seconds of communication in each, compute share it hides in
    windows = [comm_windows(w, net, p.dp, p.grad_acc) for p in usable]
    width = max((len(g) for g in windows), default=0)
    times, x, share = (
        np.array([[g[j][i] if j < len(g) else 0.0 for j in range(width)] for g in windows]).reshape(len(usable), width)
        for i in range(3)
    )
    o = OVERLAP_GRID[:, None, None]  # (overlap, point, window)
    c = np.full(len(OVERLAP_GRID), np.sum(ga * t) / np.sum(ga * ga))  # start from no communication at all
    k = np.zeros(len(OVERLAP_GRID))
    for _ in range(12):  # the saturation pattern (o·comm above its window) settles in a few rounds
        sat = o * x > share * c[:, None, None]  # an exposed window (share 0) hides nothing whatever o is
        a = ga - np.sum(np.where(sat, times * share, 0.0), axis=2)
        b = np.sum(times * np.where(sat, x, (1 - o) * x), axis=2)
        before, (c, k) = c, _compute_and_optimizer(a, updated if OPTIMIZER in free else None, t - b, t, c)
        if np.array_equal(c, before):  # a round is a function of c alone: every later one gives these c and k
            break
    hidden = np.minimum(o * x, share * c[:, None, None])
    model = ga * c[:, None] + updated * k[:, None] + np.sum(times * (x - hidden), axis=2)
    sse = np.sum(((model - t) / t) ** 2, axis=1)
    good = np.flatnonzero(sse <= sse.min() + CHI2_95 * noise_variance(usable) + 1e-12)
    best = good[len(good) // 2] if rng is None else rng.choice(good)  # among the overlaps the points cannot tell apart
    return Fit(
        float(c[best]),
        float(k[best]),
        float(OVERLAP_GRID[best]),
        net,
        (float(OVERLAP_GRID[good[0]]), float(OVERLAP_GRID[good[-1]])),
    )


def overlap_words(f: Fit) -> str:
    """The fitted overlap and how well the measured points pin it, in words."""
    lo, hi = f.overlap_range
    if hi - lo >= 0.9:
        return (
            f"the measured points do not resolve the overlap ({lo:.2f} to {hi:.2f} fit alike): the curve takes "
            f"{f.overlap:.2f}, the band draws across the range"
        )
    return f"overlap {f.overlap:.2f} fitted" + (f" ({lo:.2f} to {hi:.2f} fit within the noise)" if hi > lo else "")


def identification(
    points: Sequence[Point], dpn: Optional[int], full: Sequence[Column], notes: dict[Column, str]
) -> str:
    """What the measured points identify of the step model, in words (source (a)): `full` the columns they can
    tell apart, `notes` what `resolved_columns` says of them."""
    comm = [p.dp for p in points if p.dp >= 2]
    found, open_ = ["the compute time per micro-step"], []
    if OPTIMIZER in notes:
        open_.append(f"the optimizer step ({notes[OPTIMIZER]}: the compute and the bandwidth terms carry it)")
    elif OPTIMIZER in full:
        found.append("the optimizer step per parameter updated")
    else:
        open_.append(
            "the optimizer step (the measured dp cannot tell it from the compute and the bandwidth terms: "
            "they carry it)"
        )
    measured = {tier_of(n, dpn) for n in comm}
    for tier in TIERS:
        name = "within a node" if tier == INTRA else "between nodes"
        if tier not in measured:
            if tier == INTER and dpn is not None:
                open_.append(f"the tier between nodes (no measured dp spans more than {dpn} ranks)")
            continue
        for col, symbol in ((Column(Term.INV_BETA, tier), "β"), (Column(Term.ALPHA, tier), "α")):
            if col in notes:
                open_.append(f"{symbol} {name} ({notes[col]})")
            elif col in full:
                found.append(f"{symbol} {name}")
            elif sum(tier_of(n, dpn) == tier for n in set(comm)) < 2:
                open_.append(
                    f"{symbol} {name} (one ring length measured: latency and bandwidth inseparable; set to 0 in the "
                    "curve, drawn from its prior in the band)"
                )
            else:
                open_.append(
                    f"{symbol} {name} (not identified: {len({p.dp for p in points})} measured dp "
                    "leave no degree of freedom for it after the compute and the bandwidths; set to 0 in the curve, "
                    "drawn from its prior in the band: measure smaller dp or the network, `scaling collectives`)"
                )
    text = (
        f"measured dp {', '.join(str(p.dp) for p in points)}: {len(comm)} point(s) with communication identify "
        f"{', '.join(found)}; the overlap cannot be told from the bandwidth, so it is 0 and the figures are those "
        "of exposed communication"
    )
    return text + (f"; left open: {'; '.join(open_)}" if open_ else "")
