"""The parallel layout (scaling.core.layout): the world, GPUs <-> dp, the shard group, the names, the overrides and
the identity, in microseconds."""

from __future__ import annotations

from scaling.core.enums import ZeroStage
from scaling.core.layout import Layout, configuration_name
from scaling.core.schema import ParallelConfig


def test_a_layout_owns_the_world_and_the_gpus_of_a_dp_rank():
    layout = Layout(3, dp=4, dp_shard=2, tp=2)
    assert (layout.world_size, layout.model_parallel, layout.shard_size, layout.replicas) == (8, 2, 2, 2)
    assert layout.zero_stage is ZeroStage.PARAMETERS and layout.fsdp and layout.hybrid and layout.axes == 2
    assert layout.per_gpu(4096) == 2048  # a dp rank's tokens shared by its tp GPUs
    assert [layout.coordinates(r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_spread_over_gpus_keeps_the_shard_group_where_it_divides_and_refuses_what_tp_does_not():
    assert Layout.over(512, 2, shard_group=32, tp=2) == Layout(2, dp=256, dp_shard=32, tp=2)
    assert Layout.over(32, 2, shard_group=32) == Layout(2, dp=32)  # a group of every rank: full sharding
    assert Layout.over(6, 3, tp=4) is None and Layout(3, tp=4).at(2) is None
    template = Layout(3, dp=16, dp_shard=8)
    assert template.at(8) == Layout(3, dp=8) and template.with_dp(64) == Layout(3, dp=64, dp_shard=8)


def test_one_identity_whatever_the_spelling_of_full_sharding():
    assert Layout(3, dp=8, dp_shard=8) == Layout(3, dp=8) == Layout.of({"zero_stage": 3, "dp": 8, "dp_shard": 8})
    assert Layout.of(ParallelConfig(dp=4, zero_stage=2, tp=2)) == Layout(2, dp=4, tp=2)
    assert Layout.of({"dp": 2, "zero_stage": 1}) == Layout(1, dp=2)  # a record made before tp existed
    assert len({Layout(3, dp=8), Layout(3, dp=8, tp=2), Layout(3, dp=8, dp_shard=4)}) == 3


def test_the_names_and_overrides_say_every_axis_that_is_not_neutral():
    layout = Layout(2, dp=256, dp_shard=32, tp=2)
    assert layout.name == "ZeRO-2 (shard over 32), tp 2 × dp 256" and layout.kind == "ZeRO-2 (shard over 32), tp 2"
    assert Layout(0, dp=8).name == Layout(0, dp=8).kind == "ZeRO-0"
    assert (
        configuration_name(layout, "none", 1, 4)
        == "ZeRO-2 (shard over 32), tp 2 × dp 256, mbs 1, grad_acc 4, recompute none"
    )
    assert layout.overrides() == ["parallel.dp=256", "parallel.tp=2", "parallel.zero_stage=2", "parallel.dp_shard=32"]
    assert layout.parallel() == {"zero_stage": 2, "dp": 256, "dp_shard": 32, "tp": 2}
    assert layout.ranks() == "parallel.dp=256 x parallel.tp=2 = 512" and Layout(0, dp=2).ranks() == "parallel.dp=2"
