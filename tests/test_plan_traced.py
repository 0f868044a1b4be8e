"""Every layout the recipe plans for the presets (llama_1b to llama_70b) at 8 to 2,048 H100s and A100s and seq 2048 to
8192 is planned with its margin by the analytic predictor and fits by the traced one, the two within the largest
margin any setting takes (the trace is itself a prediction: where it exceeds the analytic figure by more than a
setting's own margin, 3b tp 2 selective +1.7% and 8b ZeRO-3 full +0.8% against 0.3% measured at tp 1 without
recomputation, it is said, not failed). Pipelined candidates are left to the stage tests (test_stage_memory).

Four cases cover the presets, both cards and the three sequence lengths, every ZeRO stage and recompute setting, and
the tensor-parallel and hybrid layouts the recipe weighs with them. A row runs a candidate's layout at the largest
mbs planned for its count (or a smaller one that divides the batch: no more memory), so each candidate at each count
stands for every row it can give. The trace is of the point's 1- and 2-block cuts, extrapolated to the preset's
blocks (scaling.predictor.calibrated.traced_by_cuts: the traces of a setting kept in the sweep directory and reused
across candidates, counts and micro-batches), not of the whole 80-block model at each count.
"""

from __future__ import annotations

import pytest

from scaling.core.batch import nearest_whole_batch
from scaling.predictor.analytic import predict_config
from scaling.predictor.calibrated import traced_by_cuts
from scaling.predictor.margin import UNMEASURED, planning_margin
from scaling.predictor.prescreen import capacity_bytes
from scaling.recipe.candidates import find_candidates, point_config
from scaling.sweep.compose import compose_config

GBS_TOKENS = 4 * 2**20
CASES = [
    pytest.param("llama_1b", "h100", 2048, [8, 2048], [0, 1], ["none", "full"], id="llama_1b"),
    pytest.param("llama_3b", "a100", 4096, [8, 512], [1, 2], ["selective"], id="llama_3b"),
    pytest.param("llama_8b", "h100", 8192, [64, 2048], [3], ["full"], id="llama_8b"),
    pytest.param(
        "llama_70b",
        "a100",
        8192,
        [256, 2048],
        [3],
        ["none", "full"],
        id="llama_70b",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("preset, hardware, seq, gpus, zero, recompute", CASES)
def test_every_planned_layout_fits_with_its_margin_by_the_trace(tmp_path, preset, hardware, seq, gpus, zero, recompute):
    overrides = [f"model={preset}", f"hardware={hardware}", "train.precision=bf16", f"train.seq_len={seq}"]
    cfg = compose_config([*overrides, "logger=none"])
    gbs = nearest_whole_batch(GBS_TOKENS, seq)
    notes: list[str] = []
    never = lambda point: pytest.fail("nothing is launched without a device at hand")  # noqa: E731
    candidates = find_candidates(cfg, zero, recompute, gpus, gbs, 0, never, tmp_path, notes)
    capacity = capacity_bytes(cfg.hardware)
    checked, worst = [], (-1.0, "")
    for c in candidates:
        for n in gpus:
            layout, mbs = c.layout.at(n), c.mbs_for(n)
            if layout is None or mbs < 1 or layout.pp > 1:  # stages: checked against their trace in test_stage_memory
                continue
            grad_acc = 2 if gbs // layout.dp > 1 else 1  # as the plan judged it (every grad_acc >= 2 the same)
            point = point_config(cfg, layout, c.recompute, mbs, grad_acc)
            margin = planning_margin(point).frac
            analytic = predict_config(point, grad_acc).total_bytes
            traced = traced_by_cuts(point, grad_acc, tmp_path)
            said = f"{c.name} at {n} GPUs, mbs {mbs}: analytic {analytic:,}, traced {traced:,}, capacity {capacity:,}"
            assert analytic <= capacity / (1 + margin), said  # planned with its margin
            assert traced <= capacity, said  # and it fits by the trace
            # the two predictors within the largest margin any setting takes (70B tp 8 was 12.4% apart)
            assert traced / analytic - 1 <= UNMEASURED, said
            checked.append((c.layout.tp, c.layout.hybrid, c.recompute))
            worst = max(worst, (traced / analytic - 1, said))
    print(f"{preset}: {len(checked)} planned layouts checked; the trace's largest excess over the analytic: "
          f"{worst[0]:+.2%} ({worst[1]})")  # fmt: skip
    # the tensor-parallel and hybrid layouts are among those checked wherever the stage shards
    assert checked and (not any(z >= 2 for z in zero) or {True} <= {tp > 1 for tp, _, _ in checked}), notes
    assert not any(z >= 2 for z in zero) or any(hybrid for _, hybrid, _ in checked)
