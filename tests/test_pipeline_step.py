"""The step model under pipeline stages (scaling.perf.pipeline, scaling.perf.step_model): the bubble, the sends
between stages on the tier they cross, the costliest stage's pace and its share of the collectives."""

from __future__ import annotations

import pytest

from scaling.core.layout import Layout
from scaling.model.family import family_of
from scaling.perf.network import INTER, INTRA, AlphaBeta, Network
from scaling.perf.pipeline import bubble_fraction, send_s, stage_costs
from scaling.perf.step_model import Workload, block_flops, stage_shape, step_collectives, step_time_s
from tests.helpers.compose import compose_point

NET = Network({INTRA: AlphaBeta(1e-5, 400e9), INTER: AlphaBeta(2e-5, 40e9)}, devices_per_node=8)
OPS = ("all_gather", "reduce_scatter")
FREE = Network({INTRA: AlphaBeta(0.0, 1e30), INTER: AlphaBeta(0.0, 1e30)}, devices_per_node=8)


def workload(pp=1, schedule="one_f_one_b", virtual=1, tp=1, zero_stage=0, model="llama_8b"):
    shape = family_of(compose_point([f"model={model}"]).model).shape(4096)
    return Workload(zero_stage, shape, "bf16", 1, 4096, None, 8, pp=pp, pp_schedule=schedule, pp_virtual=virtual, tp=tp)


def test_the_sends_cross_nodes_when_a_stage_fills_one():
    size = 2 * 4096 * 4096
    assert send_s(NET, Layout(3, 2, tp=4, pp=2), size) == pytest.approx(1e-5 + size / 400e9)  # both stages on a node
    assert send_s(NET, Layout(3, 2, tp=8, pp=2), size) == pytest.approx(2e-5 + size / 40e9)  # a node per stage


@pytest.mark.parametrize("schedule,virtual", [("one_f_one_b", 1), ("gpipe", 1), ("interleaved_1f1b", 2)])
def test_the_step_pays_the_bubble_at_the_costliest_stage(schedule, virtual):
    w, plain = workload(4, schedule, virtual), workload()
    compute, m = 0.5, 8
    block, head = block_flops(w.shape, 4096), 6.0 * 4096 * 128256
    chunks, _ = stage_costs(32, block, head, 4 * virtual)
    cost = [len(r) * block + (head if k == len(chunks) - 1 else 0.0) for k, r in enumerate(chunks)]
    ranks = [sum(cost[r::4]) for r in range(4)]  # a rank runs every 4th chunk: their sum sets its pace
    imbalance = max(ranks) / (sum(ranks) / 4)
    assert imbalance > 1.0  # 32 equal blocks and the head over 4 ranks: one carries more
    seconds = step_time_s(w, FREE, 1, compute, 0.0, grad_acc=m)
    expected = m * imbalance * compute / (1 - bubble_fraction(schedule, 4, m, virtual))
    assert seconds == pytest.approx(expected, rel=1e-9)
    if schedule == "one_f_one_b":
        assert seconds == pytest.approx((m + 3) * imbalance * compute)  # (m + pp − 1) stage times
    assert step_time_s(plain, FREE, 1, compute, 0.0, grad_acc=m) == pytest.approx(m * compute)
    # the sends: two per chunk and micro-batch (activations forward, their gradient back), at the tier between stages
    sends = step_time_s(w, NET, 1, compute, 0.0, grad_acc=m) - seconds
    one = send_s(NET, w.layout_at(1), 2 * 4096 * 4096)
    assert sends == pytest.approx(m * 2 * virtual * one / (1 - bubble_fraction(schedule, 4, m, virtual)), rel=1e-6)


def test_a_stage_holds_and_reduces_its_share_of_the_model():
    whole, staged = workload(zero_stage=3), workload(pp=4, zero_stage=3)
    part = stage_shape(whole.shape, 4, 4096)
    ranges, _ = stage_costs(32, block_flops(whole.shape, 4096), 6.0 * 4096 * 128256, 4)
    assert part.n_blocks == max(len(r) for r in ranges)
    assert sum(t.numel for t in part.tensors) < sum(t.numel for t in whole.shape.tensors) / 3
    moved, full = (
        {op: sum(c.count * c.bytes_per_call for c in step_collectives(w, 8, 8) if c.op == op) for op in OPS}
        for w in (staged, whole)
    )
    assert moved["all_gather"] < full["all_gather"] / 3 and moved["reduce_scatter"] < full["reduce_scatter"] / 3
    assert staged.layout_at(8).world_size == 32
