"""The batch-size recipe's answer: per GPU count, the configuration to run at a fixed global batch, how fast it
goes (with its band, measured or extrapolated), where data parallelism stops paying off and the most GPUs the
batch can use.

The lecture notes' recipe: (1) fix the global batch in tokens, (2) fix seq_len, (3) find the largest micro-batch
that fits one device, (4) take the GPUs you have: grad_acc = gbs / (mbs × dp); when that falls below 1 there are
more GPUs than the batch can use. Each `Candidate` (a parallel layout and a recompute setting with its largest mbs)
is fitted on its measured records (scaling.perf.extrapolation, under the network source the sweep directory has), and
each GPU count gets the candidate with the most tokens/s per GPU; candidates tied with it (scaling.core.noise.tied)
are listed, not ranked. This module decides (inputs in, rows out: scaling.recipe.options, scaling.recipe.answer);
scaling.recipe.estimate says where each figure comes from, scaling.recipe.render writes it out, and
scaling.recipe.measure measures what is missing.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from scaling.core.enums import PipelineSchedule, Recompute
from scaling.core.noise import tied
from scaling.perf.knee import DEFAULT_THRESHOLD
from scaling.perf.pipeline import bubble_fraction
from scaling.recipe.answer import Row
from scaling.recipe.options import (
    BEYOND_HORIZON,
    Beyond,
    Candidate,
    Estimator,
    Option,
    Split,
    max_useful_gpus,
)

Peak = Optional[Callable[[Candidate, Split], Optional[int]]]
"""A candidate's predicted peak bytes per rank at a split (None: not known)."""


def best_option(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    gpus: int,
    estimate: Estimator,
    peak: Peak = None,
) -> tuple[Optional[Option], list[Option], list[str], Optional[str]]:
    """The configuration to run at `gpus`: the fastest (most tokens/s per GPU, nominal), or among those tied with it
    (scaling.core.noise.tied) the least (TIE_RULE; memory by `peak` where no record measured it); the others tied
    with it, why each other candidate has no figure, and the reason of the horizon where a figure lies past it."""
    options, why, seen = [], [], set()
    beyond: Optional[str] = None
    for c in candidates:
        same = (c.at(gpus), c.recompute, c.mbs_for(gpus))
        if same in seen:  # a hybrid candidate whose groups span every rank at this count is its full sharding
            continue
        seen.add(same)
        if c.mbs_for(gpus) < 1:
            why.append(f"{c.name} does not fit at {gpus} GPUs")
            continue
        s = c.split_at(gbs_samples, seq_len, gpus)
        if s is None:
            continue
        e = estimate(c, s)
        if isinstance(e, Beyond):
            beyond = beyond or e.reason
            why.append(f"{c.name} past its horizon")
            continue
        if e is None:
            why.append(c.name)
            continue
        options.append(Option(c, s, e))
    if not options:
        return None, [], why, beyond
    fastest = max(options, key=lambda o: o.estimate.tokens_per_s_per_gpu)
    best = min((o for o in options if o is fastest or _tied(o, fastest)), key=lambda o: _less(o, peak))
    return best, [o for o in options if o is not best and _tied(o, best)], why, beyond


def _tied(a: Option, b: Option) -> bool:
    ea, eb = a.estimate, b.estimate
    return tied(ea.tokens_per_s_per_gpu, ea.low, ea.high, eb.tokens_per_s_per_gpu, eb.low, eb.high)


RECOMPUTE_WORK = tuple(str(r) for r in Recompute)
"""train.recompute settings from the least work recomputed to the most (the enum's order)."""


def _less(o: Option, peak: Peak) -> tuple[int, bool, int, int, float]:
    """TIE_RULE's order: fewer axes, full sharding, less recomputation, less memory per rank, then faster."""
    memory = o.estimate.peak_mem_bytes
    if memory is None and peak is not None:
        memory = peak(o.candidate, o.split)
    work = RECOMPUTE_WORK.index(o.candidate.recompute)
    return o.layout.axes, o.layout.hybrid, work, memory or 0, -o.estimate.tokens_per_s_per_gpu


def knee(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    counts: Sequence[int],
    estimate: Estimator,
    baseline: float,
    threshold: float,
    peak: Peak = None,
) -> tuple[Optional[int], tuple[Optional[int], Optional[int]], Optional[int]]:
    """The first GPU count whose best configuration's efficiency (against `baseline`, the most per GPU) is below
    `threshold`, its range (the first count whose band's high end is below it, and whose low end is), and the
    largest count with a figure to judge (past it: beyond the horizon, or nothing fits)."""
    first = earliest = latest = judged = None
    for n in sorted(counts):
        best, _, _, _ = best_option(candidates, gbs_samples, seq_len, n, estimate, peak)
        if best is None:
            continue
        judged = n
        e = best.estimate
        if first is None and e.tokens_per_s_per_gpu / baseline < threshold:
            first = n
        if earliest is None and e.low / baseline < threshold:
            earliest = n
        if latest is None and e.high / baseline < threshold:
            latest = n
    return first, (earliest, latest), judged


def decide(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    gpus: Sequence[int],
    estimate: Estimator,
    threshold: float = DEFAULT_THRESHOLD,
    tokens: Optional[int] = None,
    capacity_bytes: Optional[int] = None,
    predicted_peak: Peak = None,
    command: Optional[Callable[[Candidate, Split], str]] = None,
) -> tuple[
    list[Row], Optional[int], tuple[Optional[int], Optional[int]], Optional[float], Optional[int], Optional[int]
]:
    """The rows for the requested GPU counts, the first GPU count past the baseline below `threshold` with its range,
    the baseline (the most tokens/s per GPU at any count: 1 GPU but for a model that only sharding, or recompute,
    fits on few), its count, and the largest count the knee had a figure for. Pure: every figure comes from
    `estimate`."""
    top = max_useful_gpus(gbs_samples, candidates)
    counts = sorted({*(2**k for k in range(top.bit_length()) if 2**k <= top), *(n for n in gpus if n <= top)})
    baseline = baseline_gpus = None
    for n in counts:  # the most tokens/s per GPU at any count: one device, unless only sharding or recompute fits it
        base, _, _, _ = best_option(candidates, gbs_samples, seq_len, n, estimate, predicted_peak)
        if base is not None and (baseline is None or base.estimate.tokens_per_s_per_gpu > baseline):
            baseline, baseline_gpus = base.estimate.tokens_per_s_per_gpu, n
    rows = []
    for n in gpus:
        row = Row(gpus=n)
        best, ties, why, beyond = best_option(candidates, gbs_samples, seq_len, n, estimate, predicted_peak)
        if n > top:
            row.reason = (
                f"more GPUs than the batch can use: {gbs_samples} samples split over at most {top} GPUs "
                f"(mbs=1, grad_acc=1{', the largest tp' if top > gbs_samples else ''}); use at most {top} GPUs, a "
                f"larger global batch (at least {n * seq_len:,} tokens), or "
                + ("more tensor or " if top > gbs_samples else "tensor or ")
                + "pipeline parallelism to use the rest"
            )
        elif best is None and candidates and all(c.mbs_for(n) < 1 for c in candidates):
            starts = sorted((c.fit_gpus, c.name) for c in candidates if c.fit_gpus is not None)
            row.reason = f"no configuration fits per rank at {n} GPUs: " + "; ".join(
                f"{name} fits from {fit} GPUs" for fit, name in starts
            )
        elif best is None and beyond is not None:
            row.source, row.reason = BEYOND_HORIZON, beyond
        elif best is None:
            row.reason = (
                "no measured or extrapolated figure for this many GPUs"
                + (f" (candidates {', '.join(why)})" if why else "")
                + ": nothing measured, or a network tier with no figures (see the notes)"
            )
        if best is None:
            rows.append(row)
            continue
        c, s, e = best.candidate, best.split, best.estimate
        row.place(best.layout)
        row.mbs, row.grad_acc, row.recompute = s.mbs, s.grad_acc, c.recompute
        row.tp_why = (
            _tp_why(c, candidates, n, gbs_samples, seq_len, estimate, predicted_peak)
            if best.layout.tp > 1 and best.layout.pp == 1  # a pipelined row's reason is its pp_why
            else None
        )
        row.pp_why = _pp_why(best, candidates, n, gbs_samples, seq_len, estimate, predicted_peak)
        row.recompute_why = _recompute_why(best, candidates, n, gbs_samples, seq_len, estimate, predicted_peak)
        row.gbs_tokens, row.gbs_exact = s.gbs_tokens, s.exact
        row.tokens_per_s_per_gpu, row.tokens_per_s_per_gpu_low, row.tokens_per_s_per_gpu_high = (
            e.tokens_per_s_per_gpu,
            e.low,
            e.high,
        )
        row.efficiency = e.tokens_per_s_per_gpu / baseline if baseline else None
        row.step_time_s, row.source, row.source_detail = e.step_time_s, e.source, e.described()
        if tokens is not None:
            row.train_time_s = tokens / (e.tokens_per_s_per_gpu * n)
            row.gpu_hours = row.train_time_s * n / 3600
        peak = e.peak_mem_bytes if e.peak_mem_bytes is not None else (predicted_peak(c, s) if predicted_peak else None)
        row.peak_mem_bytes = peak
        if peak is not None and capacity_bytes:
            row.memory_headroom_frac = 1 - peak / capacity_bytes
        row.ties = [
            {
                "run": o.name,
                **o.layout.parallel(),
                "recompute": o.candidate.recompute,
                "mbs": o.split.mbs,
                "grad_acc": o.split.grad_acc,
                "tokens_per_s_per_gpu": o.estimate.tokens_per_s_per_gpu,
                "source": o.estimate.source,
            }
            for o in ties
        ]
        row.command = command(c, s) if command else None
        if row.dp_shard is not None:
            row.versus_full = _versus_full(candidates, gbs_samples, seq_len, n, estimate, predicted_peak)
        rows.append(row)
    first, band, judged = (
        knee(
            candidates,
            gbs_samples,
            seq_len,
            [n for n in counts if n >= baseline_gpus],
            estimate,
            baseline,
            threshold,
            predicted_peak,
        )
        if baseline
        else (
            None,
            (None, None),
            None,
        )
    )
    return rows, first, band, baseline, baseline_gpus, judged


def full_sharding(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates that shard over every rank (none of hybrid sharding)."""
    return [c for c in candidates if not c.layout.hybrid]


def _versus_full(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    gpus: int,
    estimate: Estimator,
    predicted_peak: Peak,
) -> Optional[dict[str, Any]]:
    """The best full-sharding option at `gpus` (name, tokens/s per GPU with its band, peak memory per rank)."""
    best, _, _, _ = best_option(full_sharding(candidates), gbs_samples, seq_len, gpus, estimate, predicted_peak)
    if best is None:
        return None
    e = best.estimate
    peak = (
        e.peak_mem_bytes
        if e.peak_mem_bytes is not None
        else (predicted_peak(best.candidate, best.split) if predicted_peak else None)
    )
    return {
        "run": best.name,
        "mbs": best.split.mbs,
        "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
        "low": e.low,
        "high": e.high,
        "peak_mem_bytes": peak,
    }


def knee_of_full_sharding(
    candidates: Sequence[Candidate],
    gbs_samples: int,
    seq_len: int,
    estimate: Estimator,
    baseline: Optional[float],
    baseline_gpus: Optional[int],
    threshold: float,
    peak: Peak = None,
) -> Optional[int]:
    """Where DP stops paying off with full sharding alone, when hybrid sharding is among the candidates (None
    otherwise, or when it stays above the threshold): what hybrid sharding moves."""
    full = full_sharding(candidates)
    if len(full) == len(candidates) or not full or not baseline or baseline_gpus is None:
        return None
    top = max_useful_gpus(gbs_samples, candidates)
    counts = [2**k for k in range(top.bit_length()) if baseline_gpus <= 2**k <= top]
    return knee(full, gbs_samples, seq_len, counts, estimate, baseline, threshold, peak)[0]


def _recompute_why(
    chosen: Option,
    candidates: Sequence[Candidate],
    gpus: int,
    gbs_samples: int,
    seq_len: int,
    estimate: Estimator,
    peak: Peak = None,
) -> Optional[str]:
    """Why a row recomputes (None when it does not): no option that recomputes less fits per rank at `gpus`, or its
    layout fits only with it, or it beats the best of them by the estimate (at a larger mbs, when recomputation is
    what lets that mbs fit)."""
    c = chosen.candidate
    lighter = [o for o in candidates if RECOMPUTE_WORK.index(o.recompute) < RECOMPUTE_WORK.index(c.recompute)]
    if c.recompute == Recompute.none or not lighter:
        return None
    names = " or ".join(dict.fromkeys(o.recompute for o in lighter))
    if not any(o.mbs_for(gpus) >= 1 for o in lighter):
        return f"fits only with it: with recompute {names} not even mbs=1 fits per rank at {gpus} GPUs"
    same = [o for o in lighter if o.at(gpus) == c.at(gpus) and o.mbs_for(gpus) >= 1]
    best, _, _, _ = best_option(lighter, gbs_samples, seq_len, gpus, estimate, peak)
    if best is None:
        return f"no option with recompute {names} has a figure at {gpus} GPUs"
    mbs = chosen.split.mbs
    if not same:
        how = f"{c.layout.kind} fits only with it"
    elif mbs > max(o.mbs_for(gpus) for o in same):
        how = f"faster at a larger mbs ({mbs}, where recompute {names} fits {max(o.mbs_for(gpus) for o in same)})"
    else:
        how = "faster"
    ours, theirs = chosen.estimate.tokens_per_s_per_gpu, best.estimate.tokens_per_s_per_gpu
    return (
        f"{how}: {ours:,.0f} tokens/s per GPU against {theirs:,.0f} for the best with recompute "
        f"{best.candidate.recompute} ({best.name}: {ours / theirs - 1:+.1%})"
    )


def _tp_why(
    c: Candidate,
    candidates: Sequence[Candidate],
    gpus: int,
    gbs_samples: int,
    seq_len: int,
    estimate: Estimator,
    peak: Peak = None,
) -> str:
    """Why a row runs tensor parallelism: the batch has fewer samples than GPUs, no configuration without it fits,
    or it is the fastest there."""
    plain = [o for o in candidates if o.layout.tp == 1]
    if gpus > gbs_samples:
        return (
            f"the batch's {gbs_samples} samples split over at most {gbs_samples} dp ranks: tp {c.layout.tp} uses "
            f"{gpus} GPUs"
        )
    if not any(o.mbs_for(gpus) >= 1 for o in plain):
        return f"no configuration without tensor parallelism fits per rank at {gpus} GPUs"
    best, _, _, _ = best_option(plain, gbs_samples, seq_len, gpus, estimate, peak)
    if best is None:
        return "no configuration without tensor parallelism has a figure here"
    return (
        f"the fastest by the estimate: without tensor parallelism the best is {best.candidate.name}, "
        f"{best.estimate.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
    )


def _pp_why(
    best: Option,
    candidates: Sequence[Candidate],
    gpus: int,
    gbs_samples: int,
    seq_len: int,
    estimate: Estimator,
    peak: Peak = None,
) -> Optional[str]:
    """Where pipeline stages were weighed (None: they were not): why the row runs them (nothing without them fits,
    the batch runs out of samples for dp without them, or they are the fastest despite the bubble), or why not (the
    best with them and its bubble, against the row's figure: the bubble weighed against ZeRO-3's gathers)."""
    staged = [c for c in candidates if c.layout.pp > 1]
    if not staged:
        return None
    plain = [c for c in candidates if c.layout.pp == 1]

    def bubble(o: Option) -> str:
        share = bubble_fraction(PipelineSchedule.one_f_one_b, o.layout.pp, o.split.grad_acc)
        return f"a {share:.0%} bubble (1F1B, pp {o.layout.pp}, {o.split.grad_acc} micro-batches)"

    if best.layout.pp > 1:
        if not any(c.mbs_for(gpus) >= 1 for c in plain):
            return f"no configuration without pipeline stages fits per rank at {gpus} GPUs; it pays {bubble(best)}"
        if gpus > max_useful_gpus(gbs_samples, plain):
            return (
                f"without pipeline stages the batch's {gbs_samples} samples cover at most "
                f"{max_useful_gpus(gbs_samples, plain)} GPUs; it pays {bubble(best)}"
            )
        other, _, _, _ = best_option(plain, gbs_samples, seq_len, gpus, estimate, peak)
        if other is None:
            return f"no configuration without pipeline stages has a figure here; it pays {bubble(best)}"
        return (
            f"the fastest by the estimate despite {bubble(best)}: without pipeline stages the best is {other.name}, "
            f"{other.estimate.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
        )
    alt, _, _, _ = best_option(staged, gbs_samples, seq_len, gpus, estimate, peak)
    if alt is None:
        return "pipeline stages weighed: none has a figure at this count"
    return (
        f"pipeline stages weighed, not run: the best with them, {alt.name}, "
        f"{alt.estimate.tokens_per_s_per_gpu:,.0f} tokens/s per GPU with {bubble(alt)}, against "
        f"{best.estimate.tokens_per_s_per_gpu:,.0f} without"
    )
