"""Peak memory per pipeline stage (scaling.predictor.stage_memory): the micro-batches each schedule keeps in flight,
each stage's share of the model state, and the pre-screen and `scaling predict` judging the fullest stage."""

from __future__ import annotations

import functools
import json

import pytest
from torch.distributed.pipelining.schedules import _get_warmup_ops

from scaling.cli.predict import main as predict_main
from scaling.core.schema import HardwareConfig, ParallelConfig, TrainConfig
from scaling.core.units import GIB
from scaling.model.llama.args import ModelArgs, param_count
from scaling.predictor.analytic import analytic_peak
from scaling.predictor.model_state import FP32
from scaling.predictor.prescreen import prescreen
from scaling.predictor.stage_memory import fullest_stage, in_flight, predict_peak, stage_blocks, stage_peaks
from tests.helpers.compose import compose_point

ARGS = ModelArgs(n_layers=8, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab_size=256)


def stages(pp, schedule="one_f_one_b", virtual=1, zero_stage=0, grad_acc=8, dp=1, recompute="none"):
    return stage_peaks(
        ARGS,
        TrainConfig(seq_len=32, mbs=2, precision="fp32", recompute=recompute),
        ParallelConfig(dp=dp, zero_stage=zero_stage, pp=pp, pp_schedule=schedule, pp_virtual=virtual),
        HardwareConfig(backend="nccl"),
        grad_acc,
    )


def test_in_flight_follows_each_schedule():
    assert [in_flight("one_f_one_b", 4, s, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight("one_f_one_b", 4, s, 2) for s in range(4)] == [2, 2, 2, 1]  # fewer micro-batches than stages
    assert [in_flight("gpipe", 4, s, 8) for s in range(4)] == [8] * 4
    for pp, m, v in [(4, 8, 2), (4, 16, 2), (2, 4, 3), (4, 3, 2)]:
        for rank in range(pp):
            per_round = m // max(1, m // pp)
            chunks = min(_get_warmup_ops(rank, v, per_round, pp, m) + 1, m * v)  # torch's own warm-up count
            assert in_flight("interleaved_1f1b", pp, rank, m, v) == pytest.approx(chunks / v)


def test_one_stage_is_the_whole_step():
    (only,) = stages(1)
    whole = analytic_peak(ARGS, TrainConfig(seq_len=32, mbs=2), ParallelConfig(), HardwareConfig(backend="nccl"), 8)
    assert only.breakdown == whole


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_stages_share_the_weights_and_split_the_blocks(pp):
    result = stages(pp)
    assert [b for st in result for b in st.blocks] == list(range(ARGS.n_layers))
    # ZeRO-0, untied: the stages' fp32 weights add up to the whole model's (the embedding first, the head last)
    assert sum(st.breakdown.params_bytes for st in result) == FP32 * param_count(ARGS)
    assert [list(st.blocks) for st in result] == [list(r) for r in stage_blocks(ARGS, 32, pp)]


def test_one_f_one_b_fills_the_first_stage_and_gpipe_every_stage():
    one_f = stages(4)
    assert one_f[0].breakdown.activations_bytes > one_f[1].breakdown.activations_bytes
    assert fullest_stage(one_f).rank == 0
    gpipe = stages(4, "gpipe")
    for a, b in zip(one_f, gpipe):  # the same stage keeps 8 micro-batches under GPipe, pp - s under 1F1B
        assert b.in_flight == 8 and a.in_flight == 4 - a.rank
        assert b.breakdown.activations_bytes > a.breakdown.activations_bytes
    # ZeRO-3 over 4 dp ranks: each stage's states a quarter (up to padding) of ZeRO-0's
    zero3 = stages(4, zero_stage=3, dp=4)
    for z0, z3 in zip(one_f, zero3):
        assert z3.breakdown.optimizer_bytes < z0.breakdown.optimizer_bytes / 3


def test_interleaved_holds_more_than_one_f_one_b():
    plain, inter = stages(2), stages(2, "interleaved_1f1b", virtual=2)
    assert inter[0].blocks == (0, 1, 4, 5) and inter[1].blocks == (2, 3, 6, 7)
    assert inter[0].breakdown.activations_bytes > plain[0].breakdown.activations_bytes


def test_prescreen_and_predict_judge_the_fullest_stage(capsys):
    base = ["model=small", "train.mbs=4", "train.grad_acc=4", "train.seq_len=128", "parallel.pp=2"]
    cfg = compose_point(base)
    fullest = fullest_stage(stage_peaks(cfg.model, cfg.train, cfg.parallel, cfg.hardware, 4))
    assert predict_peak(cfg).total_bytes == fullest.breakdown.total_bytes
    room = fullest.breakdown.total_bytes / GIB
    for capacity, skipped in [(room * 0.5, True), (room * 2.0, False)]:
        block = prescreen(compose_point([*base, f"hardware.memory_gb={capacity}", "hardware.reserve_gb=0"]), 4)
        assert block["skip"] is skipped and len(block["stages"]) == 2
        assert block["peak_mem_bytes"] == max(st["peak_mem_bytes"] for st in block["stages"])
    assert predict_main(["--analytic", *base]) == 0
    out = capsys.readouterr().out
    assert "pp=2" in out and f"the fullest stage, {fullest.rank}, decides the fit" in out


PIPELINED = ["model=tiny", "train.mbs=2", "train.grad_acc=4", "train.seq_len=64", "parallel.pp=2"]
"""A pipelined point: tiny, fp32, 2 stages, 4 micro-batches (1F1B unless a schedule is added)."""
TRACED_STAGES = "traced_stages"
"""The pytest-xdist group of the tests that read `traced_stages`: on one worker, each schedule is traced once."""


@functools.cache
def traced_stages(schedule: str) -> tuple[int, ...]:
    """Each stage's traced peak of PIPELINED under `schedule` (scaling.predictor.stage_trace), traced once per worker
    for the tests that compare against it."""
    from scaling.predictor.stage_trace import trace_stage_peaks

    return tuple(trace_stage_peaks(compose_point([*PIPELINED, f"parallel.pp_schedule={schedule}"]), 4))


@pytest.mark.xdist_group(TRACED_STAGES)
@pytest.mark.parametrize("schedule", ["one_f_one_b", "gpipe"])
def test_the_analytic_stages_agree_with_the_traced_stages(schedule):
    """The stage's own modules of the built-in model, run on fake tensors in the schedule's order under torch's
    tracker (scaling.predictor.stage_trace): the analytic figure of each stage within 10% (tiny, fp32, pp 2, 4
    micro-batches); GPipe's first stage, which holds all 4, above 1F1B's, which holds 2."""
    cfg = compose_point([*PIPELINED, f"parallel.pp_schedule={schedule}"])
    traced = traced_stages(schedule)
    analytic = [st.breakdown.total_bytes for st in stage_peaks(cfg.model, cfg.train, cfg.parallel, cfg.hardware, 4)]
    assert len(analytic) == len(traced) == 2
    for a, t in zip(analytic, traced):
        assert abs(a / t - 1) < 0.10, (analytic, traced)
    if schedule == "gpipe":
        assert traced[0] > traced_stages("one_f_one_b")[0]


@pytest.mark.xdist_group(TRACED_STAGES)
def test_predict_prints_both_figures_of_each_stage(capsys):
    """`scaling predict` of a pipelined point (1F1B, the default schedule): each stage's analytic and traced peak
    side by side."""
    assert predict_main(["--json", *PIPELINED]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert tuple(st["traced_peak_mem_bytes"] for st in stages) == traced_stages("one_f_one_b")


def test_a_pipelined_model_of_another_family_is_launched_unscreened_and_its_record_says_why():
    """The stage predictor is the built-in family's and the trace runs no stages: the pre-screen traced the whole
    model anyway, and the record said "RuntimeError: _apply(): Couldn't swap Embedding.weight"."""
    point = compose_point(["model=hf_llama_tiny", "train.seq_len=64", "parallel.pp=2", "train.grad_acc=2"])
    block = prescreen(point.changed(hardware={"memory_gb": 0.05}))
    assert block["peak_mem_bytes"] is None and not block["skip"]
    assert (
        block["trace_error"] == "not traced: a pipeline stage's memory is predicted for the built-in family only "
        "(the traced predictor runs no stages)"
    )
