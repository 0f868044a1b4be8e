"""The step model (analysis.step_model) fitted to one configuration's measured points, under one source.

The parameters come from one of three sources:
(a) "sweep": the compute time and whatever α-β figures the measured dp identify and resolve above the
    timing noise (o is then 0: the figures are those of exposed communication; an α within the noise is set
    to 0, since it would be extrapolated over ring lengths far past the measured ones); (b) "profile" and
    (c) "published": the network is given (with its spread), the compute time and o are fitted.

With no overlap the step time is linear in (a)'s parameters,

    t = grad_acc·compute_s + Σ_tier (bytes moved per rank · 1/β_tier + ring steps · α_tier)

one named design column per parameter (COLUMNS), solved in relative error by scipy's `lsq_linear` with every
coefficient bounded to [0, inf): a network figure the points would put below 0 is held at 0 and the others
refit around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import lsq_linear

from analysis.step_model import MICRO, WINDOW_SHARE, Point, Workload, comm_groups
from scaling.core.network import INTER, INTRA, TIERS, AlphaBeta, Network, ring_cost, tier_of

OVERLAP_GRID = np.linspace(0.0, 1.0, 101)
CHI2_95 = 3.84


class Term(Enum):
    """What a design column's coefficient is."""

    COMPUTE = "compute_s"
    INV_BETA = "1/β"
    ALPHA = "α"


@dataclass(frozen=True)
class Column:
    """One column of the design: a parameter of the step model and the tier it belongs to (None: compute)."""

    term: Term
    tier: Optional[str] = None

    def beside(self, term: Term) -> Column:
        """The column of `term` in the same tier."""
        return Column(term, self.tier)


COMPUTE = Column(Term.COMPUTE)
COLUMNS = (COMPUTE, *(Column(term, tier) for tier in TIERS for term in (Term.INV_BETA, Term.ALPHA)))
"""The design's columns in order of priority: the compute, then each tier's 1/β before its α."""


@dataclass(frozen=True)
class Design:
    """The step times with no overlap, linear in the parameters of COLUMNS."""

    matrix: np.ndarray
    """(point, COLUMNS): seconds per unit of each parameter."""

    def of(self, cols: Sequence[Column]) -> np.ndarray:
        """The matrix restricted to `cols`, in that order: (point, len(cols))."""
        return self.matrix[:, [COLUMNS.index(c) for c in cols]]


def design(w: Workload, points: Sequence[Point], dpn: Optional[int]) -> Design:
    """Each point's grad_acc (the compute's multiplier) and the bytes and ring steps it moves at its tier."""
    rows = []
    for p in points:
        row = dict.fromkeys(COLUMNS, 0.0)
        row[COMPUTE] = float(p.grad_acc)
        if p.dp >= 2:
            tier = tier_of(p.dp, dpn)
            for c in w.collectives():
                steps, moved = ring_cost(c.op, p.dp, w.bytes_of(c.moves))
                times = p.grad_acc if c.per == MICRO else 1
                row[Column(Term.INV_BETA, tier)] += times * moved
                row[Column(Term.ALPHA, tier)] += times * steps
        rows.append([row[c] for c in COLUMNS])
    return Design(np.asarray(rows, dtype=float).reshape(len(rows), len(COLUMNS)))


def identifiable(d: Design) -> list[Column]:
    """Columns the points can tell apart, in order of priority: compute, then each tier's β before its α."""
    free: list[Column] = []
    for c in COLUMNS:
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
    overlap: float
    network: Network
    overlap_range: tuple[float, float] = (0.0, 0.0)
    """Overlap values the points cannot tell from the best: squared relative error within the 95% bound of
    one parameter (χ² of 3.84) at the noise of the medians."""


def resolved_columns(d: Design, t: np.ndarray, free: Sequence[Column], noise_var: float
                     ) -> tuple[list[Column], dict[Column, str]]:
    """The free columns the points resolve, and why each other one was set to 0: a network figure the bound holds
    at 0, or an α within the noise (|t| < 2), which would otherwise be extrapolated over ring lengths far beyond
    the measured ones."""
    cols, dropped = list(free), {}
    while True:
        coef, at_zero = solve(d, t, cols)
        at_zero = [c for c in at_zero if c != COMPUTE]
        if at_zero:
            # a 1/β at 0 beside its α: α took more than its share, β-only is the cautious extrapolation
            worst = next((c.beside(Term.ALPHA) for c in at_zero
                          if c.term is Term.INV_BETA and c.beside(Term.ALPHA) in cols), at_zero[0])
            cols.remove(worst)
            dropped[worst] = "fitted below 0" if worst in at_zero else "traded against a β below 0"
            continue
        x = d.of(cols) / t[:, None]
        resid = x @ np.array([coef[c] for c in cols]) - 1
        var = max(noise_var, float(resid @ resid) / (len(t) - len(cols)) if len(t) > len(cols) else 0.0)
        norms = np.linalg.norm(x, axis=0)  # the t statistic is the same in unit columns, and better conditioned
        se = np.sqrt(np.maximum(np.diag(np.linalg.pinv((x / norms).T @ (x / norms))) * var, 0.0)) / norms
        stat = {c: coef[c] / s if s > 0 else np.inf for c, s in zip(cols, se)}
        # an α stays only when it and its tier's β both stand out of the noise: with β unresolved, α and β trade
        # for each other, and α's share grows with the ring length past the measured dps while β's does not
        weak = {c: min(v, stat.get(c.beside(Term.INV_BETA), 0.0)) for c, v in stat.items() if c.term is Term.ALPHA}
        weak = {c: v for c, v in weak.items() if v < 2}
        if not weak:
            return cols, dropped
        worst = min(weak, key=weak.get)
        cols.remove(worst)
        dropped[worst] = f"not resolved above the timing noise (t = {weak[worst]:.1f})"


def fit_sweep(w: Workload, points: Sequence[Point], dpn: Optional[int], free: Sequence[Column]) -> Fit:
    """Source (a): compute_s and the α-β figures of the free columns, no overlap (the figures are those of exposed
    communication); a tier measured but not resolved costs nothing."""
    d = design(w, points, dpn)
    coef, _ = solve(d, np.array([p.step_time_s for p in points]), free)
    tiers = {}
    for tier in TIERS:
        inv_beta, alpha = Column(Term.INV_BETA, tier), Column(Term.ALPHA, tier)
        if d.of([inv_beta, alpha]).any():  # measured: what was not resolved costs nothing
            tiers[tier] = AlphaBeta(coef[alpha], 1.0 / coef[inv_beta] if coef[inv_beta] > 0 else float("inf"))
    return Fit(coef[COMPUTE], 0.0, Network(tiers, dpn))


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


def overlap_words(f: Fit) -> str:
    """The fitted overlap and how well the measured points pin it, in words."""
    lo, hi = f.overlap_range
    if hi - lo >= 0.9:
        return (f"the measured points do not resolve the overlap ({lo:.2f} to {hi:.2f} fit alike): the curve takes "
                f"{f.overlap:.2f}, the band draws across the range")
    return f"overlap {f.overlap:.2f} fitted" + (f" ({lo:.2f} to {hi:.2f} fit within the noise)" if hi > lo else "")


def identification(points: Sequence[Point], dpn: Optional[int], full: Sequence[Column],
                   dropped: dict[Column, str]) -> str:
    """What the measured points identify of the step model, in words (source (a)): `full` the columns they can
    tell apart, `dropped` those among them set to 0 and why."""
    comm = [p.dp for p in points if p.dp >= 2]
    found, not_found = ["the compute time per micro-step"], []
    measured = {tier_of(n, dpn) for n in comm}
    for tier in TIERS:
        name = "within a node" if tier == INTRA else "between nodes"
        if tier not in measured:
            if tier == INTER and dpn is not None:
                not_found.append(f"the tier between nodes (no measured dp spans more than {dpn} ranks)")
            continue
        for col, symbol in ((Column(Term.INV_BETA, tier), "β"), (Column(Term.ALPHA, tier), "α")):
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
