"""The recipe's next measurement checked against the truth: the count it suggests (from a simulated measurement at
its own nominal figure) against what measuring each option for real does to the least certain row's band."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from scaling.core.layout import Layout
from scaling.perf.network_figures import profile_estimate
from scaling.perf.step_model import Workload
from scaling.recipe.decide import decide
from scaling.recipe.estimate import FromRecords
from scaling.recipe.next_point import half_width, suggest
from scaling.recipe.options import Candidate, split
from tests.helpers.synthetic_dp import Truth, measure, profile_of


def record(w: Workload, dp: int, grad_acc: int, times: tuple[float, ...]) -> dict[str, Any]:
    """An ok record of the truth's workload at dp, as the recipe's estimator reads one."""
    step = float(np.median(times))
    return {
        "job_key": f"z{w.zero_stage}-m{w.mbs}-d{dp}",
        "status": "ok",
        "config": {
            "parallel": {"zero_stage": w.zero_stage, "dp": dp},
            "train": {"recompute": w.recompute, "mbs": w.mbs},
        },
        "derived": {"grad_acc": grad_acc},
        "metrics": {
            "step_times_s": list(times),
            "step_time_s": step,
            "tokens_per_s_per_gpu": w.mbs * w.seq_len * grad_acc / step,
            "noise_band_frac": 0.02,
            "peak_mem_bytes": None,
        },
    }


def next_point_outcomes(
    t: Truth, counts: list[int], measured: list[int], seed: int, draws: int = 60
) -> tuple[Optional[int], dict[int, float]]:
    """The count the recipe suggests measuring next for a truth measured at `measured` (under a profile of its
    network), and for every option below its least certain row, the half-width that row's band really has once the
    truth is measured there (a noisy point, the band refitted)."""
    rng = np.random.default_rng(seed)
    w, gbs, seq = t.workload, t.workload.gbs, t.workload.seq_len
    c = Candidate(Layout(w.zero_stage), w.recompute, w.mbs, "synthetic")
    records = [record(w, p.dp, p.grad_acc, p.step_times_s) for p in measure(t, measured, rng, steps=8)]
    source = profile_estimate(profile_of(t, rng), t.network.devices_per_node, draws, rng)

    def estimator(recs: list) -> FromRecords:
        return FromRecords(recs, lambda cand, m: w, t.network.devices_per_node, source, n_draws=draws)

    rows, *_ = decide([c], gbs, seq, counts, estimator(records))
    suggested = suggest([c], rows, records, estimator, gbs, seq, t.network.devices_per_node, 11, "cuda")
    open_rows = [r for r in rows if r.tokens_per_s_per_gpu and r.source != "measured"]
    if not open_rows:
        return None, {}
    target = max(
        open_rows, key=lambda r: (r.tokens_per_s_per_gpu_high - r.tokens_per_s_per_gpu_low) / r.tokens_per_s_per_gpu
    )
    at_target = split(gbs, seq, target.gpus, target.mbs)
    outcomes = {}
    for n in (2**k for k in range(target.gpus.bit_length())):
        s = split(gbs, seq, n, target.mbs)
        if n >= target.gpus or n in measured or s is None or s.mbs != target.mbs:
            continue
        (p,) = measure(t, [n], rng, steps=8)
        after = estimator([*records, record(w, n, p.grad_acc, p.step_times_s)])(c, at_target)
        outcomes[n] = half_width(after)
    return (suggested.gpus if suggested else None), outcomes
