"""The batch-size recipe end to end (`run_recipe`), read top-down: (1) the global batch in tokens and (2) seq_len are
fixed (the nearest whole number of sequences when the batch is not one); (3) per layout and recompute setting, the
largest mbs that fits per rank (scaling.recipe.candidates); (4) grad_acc = gbs / (mbs × dp). What is missing is
measured (scaling.recipe.measure), the network found (scaling.recipe.network_plan), each row decided
(scaling.recipe.decide) from measured, extrapolated or predicted figures (scaling.recipe.estimate,
scaling.recipe.predicted), and the next measurement suggested (scaling.recipe.next_point). docs/recipe.md.
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import Any

from scaling.core.batch import nearest_whole_batch
from scaling.core.layout import AXES
from scaling.core.schema import ExperimentConfig
from scaling.launch.devices import devices_at_hand
from scaling.predictor.calibrated import predicted_peak as predicted_peak_of
from scaling.predictor.margin import planning_margin
from scaling.predictor.prescreen import capacity_bytes
from scaling.recipe.answer import Recipe
from scaling.recipe.candidates import candidate_point, find_candidates, pipeline_decision, point_config
from scaling.recipe.decide import best_option, decide, knee_of_full_sharding
from scaling.recipe.estimate import FromRecords, workload_of
from scaling.recipe.measure import Launcher, measure_candidates
from scaling.recipe.network_plan import network_source
from scaling.recipe.next_point import suggest
from scaling.recipe.options import Candidate, Split, max_useful_gpus
from scaling.recipe.predicted import ModelFigures, predicted_figures
from scaling.recipe.request import RecipeRequest


def run_recipe(cfg: ExperimentConfig, overrides: list[str], sweep_dir: Path, a: RecipeRequest) -> Recipe:
    """Measure what the sweep directory lacks, then decide every requested GPU count."""
    seq_len, hw = cfg.train.seq_len, cfg.hardware
    figures = ModelFigures.of(cfg)  # parameters, FLOPs per token and the shape of the model
    at_hand = devices_at_hand(hw)
    launch, notes = Launcher(), []
    gbs_samples = nearest_whole_batch(a.gbs_tokens, seq_len)  # (1)-(2) the batch in whole sequences
    if gbs_samples * seq_len != a.gbs_tokens:
        notes.append(
            f"--gbs-tokens {a.gbs_tokens:,} is not a whole number of {seq_len}-token sequences: the recipe runs "
            f"the nearest, {gbs_samples:,} sequences = {gbs_samples * seq_len:,} tokens"
        )
    print(f"[recipe] {at_hand} {hw.device} device(s) of {hw.name} at hand; records in {sweep_dir}", flush=True)
    # (3) per layout and recompute setting, the largest mbs that fits per rank at each count it may run at
    candidates = find_candidates(
        cfg, a.zero, a.recompute, a.gpus, gbs_samples, at_hand, launch, sweep_dir, notes, a.pp
    )  # fmt: skip
    _, pipeline = pipeline_decision(cfg, candidates, a.gpus, gbs_samples, a.pp)  # what find_candidates decided
    # measured: from the fewest GPUs each candidate fits on to all at hand, for each mbs a requested count needs (a
    # planned fit that runs out of memory lowers the candidate's mbs there and at fewer GPUs)
    candidates = measure_candidates(cfg, candidates, gbs_samples, a.gpus, at_hand, a.max_grad_acc, launch)
    if at_hand < 1:
        notes.append(f"nothing measured: no {hw.name} device at hand; run the recipe where it is")
    # the network: the directory's profile, measured now when two or more devices are at hand, else published
    source, network = network_source(
        cfg, sweep_dir, at_hand, launch.records, candidates, gbs_samples, figures.shape, a.draws, notes
    )
    # (4) every row: measured where a record is, else extrapolated from the records, else predicted
    workload = lambda c, mbs: workload_of(cfg, c, mbs, gbs_samples, figures.shape)  # noqa: E731
    planned, plan_note = predicted_figures(cfg, workload, source, a, launch.records)
    notes += [plan_note] if plan_note else []
    dpn = hw.devices_per_node

    def estimator(records: list[dict[str, Any]]) -> FromRecords:
        return FromRecords(records, workload, dpn, source, a.draws, planned)

    @functools.cache  # the tie rule asks it of the same options at every count the knee and the rows weigh
    def predicted_peak(c: Candidate, s: Split) -> int:
        # analytic; a model the built-in formulas describe, calibrated by traces; else traced in a fake world
        return predicted_peak_of(candidate_point(cfg, c, s.mbs, s.dp, s.grad_acc), s.grad_acc, sweep_dir)

    def command(c: Candidate, s: Split) -> str:
        return run_command(overrides, c.layout.with_dp(s.dp).overrides(), c.recompute, s, sweep_dir)

    estimate = estimator(launch.records)
    rows, first, band, baseline, baseline_gpus, judged = decide(
        candidates, gbs_samples, seq_len, a.gpus, estimate, a.threshold, a.tokens, capacity_bytes(hw),
        predicted_peak, command,
    )  # fmt: skip
    for row in rows:  # the margin each planned fit leaves for the predictor's error
        if row.layout is not None and row.recompute is not None:
            row.margin_frac = planning_margin(point_config(cfg, row.layout, row.recompute, row.mbs or 1)).frac
    base = (
        best_option(candidates, gbs_samples, seq_len, baseline_gpus, estimate, predicted_peak)[0]
        if baseline_gpus
        else None
    )
    first_full = knee_of_full_sharding(
        candidates, gbs_samples, seq_len, estimate, baseline, baseline_gpus, a.threshold, predicted_peak
    )
    steps = cfg.train.warmup_steps + cfg.train.steps
    next_point = suggest(
        candidates, rows, launch.records, estimator, gbs_samples, seq_len, dpn, steps, hw.device, command,
        a.max_grad_acc,
    )  # fmt: skip
    print(f"[recipe] {launch.launched} point(s) launched, {launch.answered} answered from the store", flush=True)
    return Recipe(
        model=cfg.model.name,
        seq_len=seq_len,
        gbs_tokens=gbs_samples * seq_len,
        gbs_samples=gbs_samples,
        hardware=hw.name,
        threshold=a.threshold,
        tokens=a.tokens,
        candidates=candidates,
        network=network,
        rows=rows,
        dp_stops_paying_off_at=first,
        dp_stops_paying_off_range=band,
        dp_judged_gpus=judged,
        max_useful_gpus=max_useful_gpus(gbs_samples, candidates),
        baseline_tokens_per_s_per_gpu=baseline,
        notes=notes,
        baseline_gpus=baseline_gpus,
        baseline_run=base.name if base is not None else None,
        next_measurement=next_point.to_json() if next_point is not None else None,
        dp_stops_paying_off_full=first_full,
        pipeline=pipeline,
    )


def run_command(overrides: list[str], layout: list[str], recompute: str, s: Split, sweep_dir: Path) -> str:
    """The `scaling run` command of a row: the user's overrides, then the row's layout, batch split and recompute
    (each replacing the user's own setting of it)."""
    settings = [
        f"train.mbs={s.mbs}",
        f"train.grad_acc={s.grad_acc}",
        *layout,
        f"train.recompute={recompute}",
        f"sweep_dir={sweep_dir}",
    ]
    keys = {o.split("=", 1)[0] for o in settings} | {f"parallel.{axis}" for axis in AXES}
    kept = [o for o in overrides if o.split("=", 1)[0] not in keys and not o.startswith("launch.reuse=")]
    return "scaling run " + " ".join(shlex.quote(o) for o in [*kept, *settings])
