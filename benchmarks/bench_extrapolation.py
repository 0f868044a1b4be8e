"""Fit on the smallest dp, predict the largest: the DP extrapolation's errors on synthetic truths.

    python benchmarks/bench_extrapolation.py [--seeds 10] [--draws 200] [--noise 0.02]

Each truth is a step model with known parameters (tests/helpers/synthetic_dp.py: Llama 1B/8B at seq 4096-8192,
ZeRO 0-3 with the collectives the engine issues (a bucketed all-reduce, a broadcast per tensor, gathers behind
the first forward or every forward), overlap 0-0.8, the optimizer step of a fused or a foreach AdamW, clipping,
recomputation, NVLink-like and InfiniBand-like tiers on 8-GPU nodes, a fixed global batch).
Its points are drawn with `--noise` relative noise on each of 5 timed steps, and fitted under each source:
(a) the sweep alone, measured at dp 1-32 (both tiers); (b) a profile of the truth's network as
`scaling collectives` would measure it (5% noise per call) with dp 1-8 (one node); (c) published ranges that
hold the truth's network (tests/helpers/network/synthetic.yaml) with dp 1-8; then the Playbook's case, dp 8-32
only, under (a) and (b). Per truth and source, over the seeds: the median and largest relative error of the
nominal tokens/s per GPU at each held-out dp, how often the knee (first dp below 80%) is within one power of two
and inside the stated knee range, how often the 95% band covers the truth at every held-out dp,
and the optimizer's time per parameter, true and fitted (median over the seeds; 0 where the points leave it to
the compute and the bandwidth terms). Then, per truth, the information limit of source (a): the standard deviation
of the extrapolated step time that its points allow at all (`--limits` prints only that). No timing: the figures
depend on the seeds only. Prints Markdown; asserts nothing.

`--coverage` prints the calibration and the sharpness of the bands instead: over the truths above and over truths
with effects the step model does not contain (tests/helpers/synthetic_dp.py `MISMATCHED`: a third network tier,
congestion that grows with the ring, a straggler rank, an optimizer step that grows with the shard count), at the
held-out points 2× and 4× past the largest measured dp: the share whose truth lies inside the band, the median
relative half-width, the mean relative interval score (Gneiting & Raftery: the width plus 2/α times the miss) and
the median and largest error of the nominal curve; then each published table (tests/helpers/published_dp.py),
fitted on its smaller GPU counts through the report's own functions and held out above (`--published`: those
only; `--tuning-only`: without the tables kept out of tuning).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.dp_extrapolation import workload_and_points
from scaling.perf.dp_fit import COLUMNS, OPTIMIZER, design, identifiable
from scaling.perf.extrapolation import BAND, Extrapolation, extrapolate
from scaling.perf.knee import find_knee
from scaling.perf.network import NetworkEstimate
from scaling.perf.network_figures import network_sources, profile_estimate
from scaling.perf.step_model import Point
from tests.helpers.published_dp import TABLES, Table
from tests.helpers.synthetic_dp import (
    MISMATCHED,
    TRUTHS,
    Truth,
    h100_network,
    llama_1b,
    measure,
    profile_of,
    published_synthetic,
)

EXTRA = (
    Truth("1B ZeRO-2, overlap 0.8 (plateau near 80%)", llama_1b(2, gbs=1024, mbs=2), h100_network(), 0.15, 0.8),
    Truth(
        "1B ZeRO-0, inter-node 37 GB/s, 15 µs (bends past the node)",
        llama_1b(0),
        h100_network(inter_alpha_s=15e-6, inter_beta=37e9),
        0.075,
        0.5,
    ),
    Truth("1B ZeRO-0, foreach AdamW 50 ps/param, overlap 0.5", llama_1b(0), h100_network(), 0.075, 0.5, 50e-12),
)
"""Beyond the tests' truths: one whose efficiency stays near the threshold over several doublings (the knee
is ill-defined), one whose slower inter-node tier bends the curve right past the measured node, one whose
optimizer step (an unfused AdamW, 62 ms a step for every rank) is most of the step at dp=512."""
SOURCES = (
    ("(a) sweep, dp 1-32", (1, 2, 4, 8, 16, 32)),
    ("(b) profile, dp 1-8", (1, 2, 4, 8)),
    ("(c) published, dp 1-8", (1, 2, 4, 8)),
    ("(a) sweep, dp 8-32", (8, 16, 32)),
    ("(b) profile, dp 8-32", (8, 16, 32)),
)
"""The last two are the Playbook's case: fit on dp 8-32, predict dp 64-128, from the sweep alone and with the
network measured as `scaling collectives` does (what `scaling recipe` measures beside its points)."""


def run(
    truth: Truth, source: str, dps: tuple[int, ...], seed: int, draws: int, noise: float, doubt: bool = True
) -> Extrapolation:
    """One fit of one truth's drawn points under one source (`doubt=False`: the band of the bootstrap alone)."""
    rng = np.random.default_rng(seed)
    points = measure(truth, dps, rng, noise=noise)
    net: Optional[NetworkEstimate] = None
    if source.startswith("(b)"):
        net = profile_estimate(profile_of(truth, rng), 8, draws, rng)
    elif source.startswith("(c)"):
        net = published_synthetic(draws, rng)
    return extrapolate(
        truth.name,
        truth.workload,
        points,
        8,
        net,
        n_draws=draws,
        seed=seed,
        run_to_run=0.02 if doubt else 0.0,
        model_form_doubt=doubt,
    )


def _inside(r: Extrapolation, n: int, truth: float) -> bool:
    i = r.dps.index(n)
    return r.low[i] <= truth <= r.high[i]


ALPHA = 1 - (BAND[1] - BAND[0]) / 100
"""The band is the central (1 − α) interval of the draws: α = 0.05."""


def interval_score(low: float, high: float, truth: float) -> float:
    """Gneiting & Raftery's interval score of a central (1 − α) interval (JASA 2007, eq. 43), relative to the truth:
    its width plus 2/α times the distance by which the truth falls outside it, divided by the truth."""
    miss = max(low - truth, 0.0) + max(truth - high, 0.0)
    return (high - low + 2 / ALPHA * miss) / truth


@dataclass
class Scores:
    """The held-out points of one cell: whether each is covered, its relative half-width, interval score, error."""

    covered: list[bool] = field(default_factory=list)
    half_width: list[float] = field(default_factory=list)
    score: list[float] = field(default_factory=list)
    error: list[float] = field(default_factory=list)

    def add(self, r: Extrapolation, n: int, truth: float) -> None:
        """Score the extrapolation `r` at dp=n against the truth."""
        i = r.dps.index(n)
        lo, hi, nominal = r.low[i], r.high[i], r.tokens_per_s_per_gpu[i]
        self.covered.append(lo <= truth <= hi)
        self.half_width.append((hi - lo) / 2 / nominal)
        self.score.append(interval_score(lo, hi, truth))
        self.error.append(abs(nominal / truth - 1))

    def cell(self) -> str:
        """`covered/n (%) · median half-width % · mean interval score % · median/largest error %`."""
        if not self.covered:
            return "–"
        k, n = sum(self.covered), len(self.covered)
        return (
            f"{k}/{n} ({100 * k / n:.0f}%) · ±{100 * statistics.median(self.half_width):.1f} · "
            f"{100 * statistics.mean(self.score):.1f} · {100 * statistics.median(self.error):.1f}/"
            f"{100 * max(self.error):.1f}"
        )


def coverage_rows(truths: tuple[Truth, ...], seeds: int, draws: int, noise: float) -> list[str]:
    """Markdown rows: per source, over the truths and seeds, at 2× and 4× past the largest measured dp: the band's
    coverage, its median relative half-width, its mean relative interval score and the nominal's median/largest
    error."""
    rows = []
    for source, dps in SOURCES:
        top = max(dps)
        cells = {2: Scores(), 4: Scores()}
        for truth in truths:
            for seed in range(seeds):
                r = run(truth, source, dps, seed, draws, noise)
                for k, scores in cells.items():
                    if k * top in r.dps:
                        scores.add(r, k * top, truth.tokens_per_s_per_gpu(k * top))
        rows.append(f"| {source} | {cells[2].cell()} | {cells[4].cell()} |")
    return rows


def published_rows(
    draws: int, tables: tuple[Table, ...] = TABLES, errors: Optional[dict[str, list[float]]] = None
) -> list[str]:
    """Markdown rows: each published table fitted on its smaller GPU counts under (a) and (c), every held-out count:
    the nominal [band] against the published figure, its error, covered or not, the band's half-width and interval
    score; each held-out row's relative error of tokens/s per GPU added to `errors` by source kind."""
    rows = []
    for table in tables:
        w, points = workload_and_points(table.frame(table.fitted))
        found, _ = network_sources(None, None, Path("."), table.hardware, 8, draws)
        for src in found:
            r = extrapolate(table.name, w, points, 8, src, n_draws=draws)
            cells = []
            for n in table.held_out:
                truth = table.tokens_per_s_per_gpu[n][1]
                if n not in r.dps or not r.within(n):
                    cells.append(f"{n}: {'past the horizon' if n in r.dps else 'not reached'}")
                    continue
                i = r.dps.index(n)
                lo, hi, nominal = r.low[i], r.high[i], r.tokens_per_s_per_gpu[i]
                if errors is not None:
                    errors.setdefault("(a) sweep" if src is None else "(c) published network", []).append(
                        nominal / truth - 1
                    )
                cells.append(
                    f"{n}: {nominal:,.0f} [{lo:,.0f}, {hi:,.0f}] vs {truth:,.0f}: {100 * (nominal / truth - 1):+.1f}%, "
                    f"{'in' if lo <= truth <= hi else 'OUT'}, ±{100 * (hi - lo) / 2 / nominal:.1f}%, "
                    f"score {100 * interval_score(lo, hi, truth):.1f}%"
                )
            kind = "(a) sweep" if src is None else f"(c) {table.hardware}"
            tuned = "" if table.tuning else " (kept out of tuning)"
            rows.append(f"| {table.name}{tuned} | {', '.join(map(str, table.fitted))} | {kind} | {'; '.join(cells)} |")
    return rows


def coverage(seeds: int, draws: int, noise: float, synthetic: bool = True, tuning_only: bool = False) -> None:
    """Markdown: the bands' calibration and sharpness on synthetic truths (with and without model mismatch) and on
    published tables."""
    head = (
        "| source (measured dp) | 2× past: covered · median half-width % · mean interval score % · median/largest "
        "error % | 4× past |\n|---|---|---|"
    )
    if synthetic:
        print(f"{seeds} seeds, {draws} draws, {noise:.0%} noise per timed step\n")
        print("Truths the step model contains (TRUTHS and EXTRA):\n\n" + head)
        print("\n".join(coverage_rows((*TRUTHS, *EXTRA), seeds, draws, noise)), flush=True)
        print("\nTruths with effects it does not contain (MISMATCHED):\n\n" + head)
        print("\n".join(coverage_rows(MISMATCHED, seeds, draws, noise)), flush=True)
    tables = tuple(t for t in TABLES if t.tuning or not tuning_only)
    print(f"\nPublished tables (tests/helpers/published_dp.py), {draws} draws, fitted on their smaller GPU counts:\n")
    print("| table | fitted GPUs | source | held-out GPUs: nominal [band] vs published |\n|---|---|---|---|")
    errors: dict[str, list[float]] = {}
    print("\n".join(published_rows(draws, tables, errors)))
    print()
    for kind, e in errors.items():
        print(
            f"- {kind}: mean absolute error of tokens/s per GPU over the {len(e)} held-out rows "
            f"{100 * statistics.mean(abs(v) for v in e):.1f}% (largest {100 * max(abs(v) for v in e):.1f}%)"
        )


def summarise(truth: Truth, source: str, results: list[Extrapolation]) -> list[str]:
    """Markdown rows: the errors per held-out dp, then the knee and band line."""
    measured = max(results[0].measured)
    held_out = [n for n in results[0].dps if n > measured]
    errors = {
        n: [
            abs(r.tokens_per_s_per_gpu[r.dps.index(n)] / truth.tokens_per_s_per_gpu(n) - 1)
            for r in results
            if n in r.dps
        ]
        for n in held_out
    }
    true_next = find_knee(list(results[0].dps), truth.efficiency(list(results[0].dps)), 0.8)[1]
    knee_ok = sum(
        r.next_dp is not None and true_next is not None and abs(math.log2(r.next_dp / true_next)) <= 1 for r in results
    )
    in_range = sum(
        true_next is not None and r.next_dp_band[0] <= true_next <= (r.next_dp_band[1] or math.inf) for r in results
    )
    covered = sum(
        all(r.low[i] <= truth.tokens_per_s_per_gpu(n) <= r.high[i] for i, n in enumerate(r.dps) if n > measured)
        for r in results
    )
    errs = " ".join(f"{n}: {100 * statistics.median(e):.1f}/{100 * max(e):.1f}" for n, e in errors.items())
    knees = sorted({r.next_dp for r in results}, key=lambda d: d or math.inf)
    optimizer = statistics.median(r.params["optimizer_s_per_param"][0] for r in results)
    return [
        f"| {truth.name} | {source} | {errs or 'none: stops at the node'} | {true_next} | "
        f"{', '.join(str(k) for k in knees)} | {knee_ok}/{len(results)} | {in_range}/{len(results)} | "
        f"{covered}/{len(results)} | {1e12 * truth.optimizer_s_per_param:.0f} / {1e12 * optimizer:.0f} |"
    ]


def information_limit(truth: Truth, dps: tuple[int, ...], held_out: list[int], noise: float, steps: int = 5) -> str:
    """What source (a)'s points can say at all: the standard deviation of the extrapolated step time at each held-out
    dp, relative, for the unbounded least squares over the step model's columns but the optimizer's (exposed
    communication) at
    the timing noise of a median of `steps` steps. No estimator without outside knowledge does much better; the
    bounded fit and the α rule trade some of it for bias."""
    w = truth.workload
    t = np.array([truth.step_time_s(n) for n in dps])
    d = design(w, [Point(n, w.grad_acc_at(n), (1.0,)) for n in dps], 8)
    # the columns these points tell apart, the optimizer's left to the compute and the bandwidth terms as the fit
    # leaves it when it is not resolved (with it the limit only widens)
    cols = identifiable(d, [c for c in COLUMNS if c != OPTIMIZER])
    x = d.of(cols) / t[:, None]
    sigma = noise * math.sqrt(math.pi / (2 * steps))  # of a median of `steps` normal draws
    cov = np.linalg.inv(x.T @ x) * sigma**2
    cells = []
    for n in held_out:
        row = design(w, [Point(n, w.grad_acc_at(n), (1.0,))], 8).of(cols)[0]
        cells.append(f"{n}: {100 * math.sqrt(row @ cov @ row) / truth.step_time_s(n):.1f}")
    return " ".join(cells) + f" ({len(cols)} columns identified)"


def limits(noise: float) -> None:
    """Markdown: the information limit of source (a) per truth."""
    dps = SOURCES[0][1]
    print("\n| truth | (a) measured dp 1-32: σ of the extrapolated step time, % |\n|---|---|")
    for truth in (*TRUTHS, *EXTRA):
        print(f"| {truth.name} | {information_limit(truth, dps, [64, 128, 256], noise)} |")


def main(argv: Optional[list[str]] = None) -> int:
    """Print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--draws", type=int, default=200)
    p.add_argument("--noise", type=float, default=0.02, help="relative noise of each timed step")
    p.add_argument("--limits", action="store_true", help="print only the information limit of source (a)")
    p.add_argument("--coverage", action="store_true", help="print only the bands' calibration and sharpness")
    p.add_argument("--published", action="store_true", help="with --coverage: the published tables only")
    p.add_argument("--tuning-only", action="store_true", help="leave out the tables kept out of tuning")
    a = p.parse_args(argv)
    if a.limits:
        limits(a.noise)
        return 0
    if a.coverage:
        coverage(a.seeds, a.draws, a.noise, not a.published, a.tuning_only)
        return 0
    print(f"{a.seeds} seeds, {a.draws} draws, {a.noise:.0%} noise per timed step, 5 timed steps per point\n")
    print(
        "| truth | source (measured dp) | held-out dp: median/largest error, % | true first dp < 80% | "
        "predicted | knee ±1 power of 2 | truth in knee range | band covers every held-out dp | "
        "optimizer ps/param: true / fitted |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for truth in (*TRUTHS, *EXTRA):
        for source, dps in SOURCES:
            results = [run(truth, source, dps, seed, a.draws, a.noise) for seed in range(a.seeds)]
            print("\n".join(summarise(truth, source, results)), flush=True)
    limits(a.noise)
    return 0


if __name__ == "__main__":
    sys.exit(main())
