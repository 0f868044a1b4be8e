"""The per-call cost (scaling.perf.call_cost) and the target's scatter in the band (scaling.perf.extrapolation):
pure arithmetic, microseconds."""

from __future__ import annotations

import numpy as np
import pytest

from scaling.core.schema import ModelConfig
from scaling.perf.call_cost import (
    CallCost,
    call_counts,
    calls_per_step,
    draw,
    fit_collective_s,
    fit_tp_region_s,
    fixed_s,
    step_time_with_calls_s,
)
from scaling.perf.dp_fit import Fit
from scaling.perf.extrapolation import RUN_TO_RUN, Draw, ModelForm, launch_scatter, target_scatter
from scaling.perf.network import INTRA, AlphaBeta, Network, ring_cost
from scaling.perf.step_model import TP, Workload, step_collectives, step_time_s
from tests.helpers.synthetic_dp import shape

SMALL = ModelConfig(name="small", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=512, vocab_size=1024)
NET = Network({INTRA: AlphaBeta(200e-6, 1.5e9)}, None)


def _w(stage: int, tp: int = 1) -> Workload:
    return Workload(stage, shape(SMALL), "fp32", 2, 64, None, tp=tp)


def test_each_call_pays_its_fixed_cost_and_one_rank_pays_none():
    assert calls_per_step(_w(2), 1, 2) == (0, 0)  # one rank: nothing communicated
    dp_calls, regions = calls_per_step(_w(2, tp=2), 1, 2)
    tp_listed = sum(c.count for c in step_collectives(_w(2, tp=2), 1, 2) if c.group == TP)
    assert (dp_calls, regions) == (0, tp_listed)  # dp=1 × tp=2: the tp regions only
    assert calls_per_step(_w(2, tp=2), 1, 4)[1] == 2 * regions  # per micro-step
    dp_only, _ = calls_per_step(_w(3), 4, 1)
    assert dp_only == sum(c.count for c in step_collectives(_w(3), 4, 1))
    cost = CallCost(collective_s=1e-3, tp_region_s=2e-3)
    assert fixed_s(_w(3), 4, 1, cost) == pytest.approx(dp_only * 1e-3)
    base = step_time_s(_w(2, tp=2), NET, 1, 0.1, 0.0, 1e-9, 2)
    assert step_time_with_calls_s(_w(2, tp=2), NET, 1, 0.1, 0.0, 1e-9, 2, cost) == pytest.approx(base + regions * 2e-3)
    assert step_time_with_calls_s(_w(2, tp=2), NET, 1, 0.1, 0.0, 1e-9, 2, CallCost()) == base


def test_a_sharded_modules_call_and_a_plain_call_are_charged_apart():
    # ZeRO-1: the bucketed all-reduce and one broadcast per parameter tensor, plain calls on one tensor each
    module, plain, _ = call_counts(_w(1), 2, 1)
    assert module == 0 and plain == 1 + len(shape(SMALL).tensors)
    # ZeRO-3 (no clipping here): a gather per module forward and per block backward, a reduce-scatter per module
    module, plain, _ = call_counts(_w(3), 2, 1)
    blocks = SMALL.n_layers
    assert module == (blocks + 1) + blocks + (blocks + 1) and plain == 0
    cost = CallCost(collective_s=10e-3, plain_call_s=1e-4)
    assert fixed_s(_w(1), 2, 1, cost) == pytest.approx((1 + len(shape(SMALL).tensors)) * 1e-4)
    assert fixed_s(_w(3), 2, 1, cost) == pytest.approx(module * 10e-3)
    assert calls_per_step(_w(1), 2, 1)[0] == 1 + len(shape(SMALL).tensors)  # both kinds together


def test_a_planted_region_cost_is_found_from_the_unaccounted_time():
    w = _w(2, tp=2)
    _, regions = calls_per_step(w, 1, 2)
    assert fit_tp_region_s(regions * 3.7e-3, w, 1, 2) == pytest.approx(3.7e-3)
    assert fit_tp_region_s(-0.01, w, 1, 2) == 0.0  # faster than modelled: no negative cost
    with pytest.raises(ValueError, match="no tensor-parallel region"):
        fit_tp_region_s(0.1, _w(2), 1, 2)


def _samples(ops: tuple[str, ...], c: float, alpha: float, beta: float) -> list[dict]:
    out = []
    for op in ops:
        for size in (16 * 2**10, 256 * 2**10, 2**20, 4 * 2**20):
            steps, moved = ring_cost(op, 2, size)
            out.append({"op": op, "world_size": 2, "size_bytes": size, "time_s": c + steps * alpha + moved / beta})
    return out


def test_the_collectives_benchmark_tells_a_per_call_cost_from_alpha_only_where_ring_steps_differ():
    found = fit_collective_s(_samples(("all_reduce", "all_gather", "reduce_scatter"), 90e-6, 150e-6, 1.5e9))
    assert found is not None
    c, alpha, inv_beta = found
    assert (c, alpha, 1 / inv_beta) == pytest.approx((90e-6, 150e-6, 1.5e9), rel=1e-6)
    # a gather and a reduce-scatter on two ranks both take one ring step: per call and per step are one column
    assert fit_collective_s(_samples(("all_gather", "reduce_scatter"), 90e-6, 150e-6, 1.5e9)) is None


def test_a_term_not_fitted_is_drawn_from_its_prior_a_fitted_one_kept():
    rng = np.random.default_rng(0)
    drawn = [draw(rng, tp_region_s=4e-3) for _ in range(50)]
    assert {d.tp_region_s for d in drawn} == {4e-3}
    assert len({d.collective_s for d in drawn}) == 50 and all(0 <= d.collective_s <= 30e-6 for d in drawn)


def test_the_targets_scatter_comes_from_the_residuals_or_the_prior():
    assert target_scatter([0.05, -0.05], 2) == RUN_TO_RUN  # no degree of freedom: the prior
    assert target_scatter([0.05, -0.05, 0.05, -0.05], 2) == pytest.approx(np.sqrt(4 * 0.05**2 / 2))
    assert target_scatter([0.001, -0.001, 0.0], 1) == RUN_TO_RUN  # never below the prior


def test_the_launch_scatter_pools_each_points_repeats_and_keeps_the_prior():
    import math

    assert launch_scatter([[1.0], [2.0]]) == RUN_TO_RUN  # no repeated launch: the prior
    e = math.exp(0.1)
    # two points of two launches each, 0.1 apart in log: each point's variance 0.005 on one degree of freedom
    assert launch_scatter([[1.0, e], [2.0, 2.0 * e], [3.0]]) == pytest.approx(math.sqrt(0.005))
    assert launch_scatter([[1.0, 1.001]]) == RUN_TO_RUN  # never below the prior


def test_a_draws_scatter_moves_its_step_time_at_every_dp():
    w = Workload(3, shape(SMALL), "bf16", 1, 64, 8)
    f = Fit(0.1, 1e-9, 0.0, NET)
    plain, moved = Draw(f, ModelForm(2)), Draw(f, ModelForm(2, kappa=0.2), scatter=0.03)
    assert moved.step_time_s(w, 2) == pytest.approx(plain.step_time_s(w, 2) * 1.03)  # within the measured dp
    assert moved.step_time_s(w, 8) == pytest.approx(Draw(f, ModelForm(2, kappa=0.2)).step_time_s(w, 8) * 1.03)
