"""Pipeline parallelism (`parallel.pp`): the blocks split into stages on torch.distributed.pipelining, each schedule
checked against the same global batch on one rank (real torchrun points on warm ranks, those of 4 ranks oversubscribed:
they check correctness, not speed), data parallelism over the stages' ranks with ZeRO, a model one brings and a Hugging
Face config cut between their blocks, the record's stage of the peak, and the refusals before any process starts."""

from __future__ import annotations

import pytest

from scaling.core.layout import Layout
from scaling.core.validate import InvalidConfig, validate
from scaling.job.run import run_point
from scaling.job.throughput import peak_stage
from scaling.model.family import family_of
from tests.helpers.compose import compose_point
from tests.helpers.points import CLIP, ON_WARM_RANKS, point

ONE_TIMED = "train.steps=1"
"""The pipeline's points time one step after the two warm-up steps (the CPU floor): three optimizer steps compared,
the first two on weights the schedule itself updated; the timed step gives the record's throughput and bubble."""
STEPS = 3
FOUR_BLOCKS = ["model.n_layers=4", CLIP, ONE_TIMED]
ONE_RANK = [*FOUR_BLOCKS, "train.grad_acc=2"]
PIPELINE = [*ONE_RANK, "parallel.pp=2"]
"""2 ranks, the hardware block of the session's other 2-rank points (tests/helpers/points.py): they run on one warm job."""
OVERSUBSCRIBED = "hardware.oversubscribe=true"
"""4 ranks (dp=2 x pp=2) on a host of fewer cores."""
TOL = 1e-5
"""fp32: a stage runs each micro-batch's ops as one rank does; only the micro-batches' gradients are summed and then
divided by their count (torch's `scale_grads`) where one rank divides each micro-batch's loss first: rounding."""


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b))


def assert_same_training(a: dict, b: dict, tol: float = TOL) -> None:
    assert a["status"] == b["status"] == "ok", (a["error"], b["error"])
    for key in ("losses", "grad_norms"):
        x, y = a["metrics"][key], b["metrics"][key]
        assert len(x) == len(y) == STEPS and max(rel(p, q) for p, q in zip(x, y)) <= tol, (key, x, y)
    assert rel(a["metrics"]["final_param_norm"], b["metrics"]["final_param_norm"]) <= tol


@pytest.mark.torchrun
@pytest.mark.parametrize(
    "schedule, virtual",
    [("gpipe", 1), ("one_f_one_b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 2)],
)
def test_two_stages_train_the_losses_of_one_rank_for_each_schedule(point_store, schedule, virtual):
    """pp=2 (2 ranks, each 2 blocks, or 2 stages of 1 block when interleaved) trains the losses, gradient norms (the
    clip's norm over both stages) and weights of pp=1 at the same global batch (grad_acc 2 micro-batches of mbs 2),
    within 1e-5 in fp32; its throughput per GPU divides by the 2 ranks and the record names the stage of the peak."""
    one = point(point_store, *ONE_RANK)
    pp = point(point_store, *PIPELINE, f"parallel.pp_schedule={schedule}", f"parallel.pp_virtual={virtual}")
    assert_same_training(pp, one)
    assert pp["derived"]["world_size"] == pp["env"]["world_size"] == 2
    m = pp["metrics"]
    assert m["tokens_per_s_per_gpu"] == pytest.approx(m["tokens_per_s"] / 2)
    assert m["mfu"] == pytest.approx(pp["derived"]["flops_per_token"] * m["tokens_per_s"] / 2 / m["peak_flops_per_s"])
    per_rank = m["peak_mem_bytes_per_rank"]
    assert len(per_rank) == 2 and m["peak_mem_stage"] == per_rank.index(max(per_rank))
    assert one["metrics"]["peak_mem_stage"] is None and one["metrics"]["pipeline_idle_frac_per_rank"] is None
    idle = m["pipeline_idle_frac_per_rank"]  # each stage waits for the other some of the time: the bubble, measured
    assert len(idle) == 2 and all(0 < f < 1 for f in idle), idle


@pytest.mark.torchrun
@pytest.mark.parametrize(
    "settings",
    [
        ["parallel.zero_stage=1"],
        ["parallel.zero_stage=3", "parallel.fsdp_grad_reduce=last_micro_step"],
    ],
    ids=["zero1-1f1b", "zero3-1f1b"],
)
def test_data_parallelism_over_pipeline_stages_trains_the_losses_of_one_rank(point_store, settings):
    """dp=2 × pp=2 (4 ranks: two pipelines, each stage's 2 ranks averaging its gradients: ZeroRedundancyOptimizer over
    them, or FSDP2 sharding the stage) trains what dp=1 × pp=1 does with grad_acc 4, within 1e-5."""
    one = point(point_store, *FOUR_BLOCKS, "train.grad_acc=4")
    both = point(point_store, *PIPELINE, "parallel.dp=2", OVERSUBSCRIBED, *settings)
    assert_same_training(both, one)
    assert both["derived"]["world_size"] == 4 and both["derived"]["gbs"] == one["derived"]["gbs"]


@pytest.mark.torchrun
def test_a_hugging_face_config_is_cut_between_its_decoder_layers(point_store):
    """transformers' Llama built from hf_llama_tiny's config, its 2 decoder layers on 2 stages (GPipe): the
    training of one rank, within 1e-5. One rank's batch is trained at dp=2, grad_acc=1 (test_engine.py's DP split),
    on the same warm job of 2 ranks: transformers is imported by the ranks of one job, not two."""
    hf = ["model=hf_llama_tiny", "train.seq_len=32", CLIP, ONE_TIMED]
    split = point(point_store, *hf, "parallel.dp=2", "train.grad_acc=1")
    pp = point(point_store, *hf, "parallel.pp=2", "parallel.pp_schedule=gpipe", "train.grad_acc=2")
    assert_same_training(pp, split)
    assert split["derived"]["gbs"] == pp["derived"]["gbs"] and split["derived"]["world_size"] == 2


@pytest.mark.torchrun
def test_a_model_one_brings_is_cut_between_its_blocks_and_trains_the_losses_of_one_rank(warm_project, tmp_path):
    """gpt.py's GPT-2-style model (learned positions, LayerNorm, untied head), its forward cut between its 2 blocks
    by stand-ins and hooks, pp=2 under 1F1B: the losses, clipped gradient norms and weights of the same batch trained
    without stages, within 1e-5 (the whole model initialised once on the CPU, each stage's part copied in). That
    batch is trained at dp=2, grad_acc=1 (what one rank trains: test_engine.py's DP split), so both points run on one
    warm job of 2 ranks: the project on PYTHONPATH gives its points warm jobs of their own, which the session's other
    2-rank points of a model one brings share (warm_project)."""
    from scaling.sweep.compose import compose_config

    base = [
        "model=gpt2_tiny", "logger=none", "train.seq_len=32", "train.mbs=2", "train.warmup_steps=2", "train.steps=1",
        *ON_WARM_RANKS, CLIP, f"sweep_dir={tmp_path / 'runs'}",
    ]  # fmt: skip
    split = run_point(compose_config([*base, "parallel.dp=2", "train.grad_acc=1"]))
    pp = run_point(compose_config([*base, "parallel.pp=2", "train.grad_acc=2"]))
    assert_same_training(pp, split)
    assert split["derived"]["gbs"] == pp["derived"]["gbs"] == 4 and split["derived"]["world_size"] == 2
    assert pp["derived"]["flops_source"] == "counted" and pp["derived"]["world_size"] == 2


def test_a_model_whose_weights_are_tied_across_stages_is_refused_before_any_process(project):
    """nanoGPT's embedding tied to its head would sit on the first and the last stage: refused, naming it."""
    from scaling.model.family import checked
    from scaling.sweep.compose import compose_config

    cfg = compose_config(["model=nanogpt_tiny", "parallel.pp=2", "train.grad_acc=2", "hardware.oversubscribe=true"])
    validate(cfg, host=False)
    with pytest.raises(InvalidConfig) as err:
        checked(cfg.model, cfg.train.seq_len, 1, 2)
    assert "model 'nanogpt_tiny': its weights tied across modules" in str(err.value)
    with pytest.raises(InvalidConfig) as err:
        checked(cfg.model, cfg.train.seq_len, 1, 3)
    assert "3 pipeline stages (parallel.pp x pp_virtual) but model 'nanogpt_tiny' has 2 blocks" in str(err.value)


def test_the_split_is_the_one_split_by_flops_with_the_head_on_the_last_stage():
    """The built-in family's stage costs sum to its FLOPs per token (blocks, the head's 6·h·V on the last stage), and
    the engine's split is scaling.core.stages.split_blocks of them: a head as costly as blocks moves blocks forward."""
    for vocab, halves in ((512, [range(0, 2), range(2, 4)]), (4096, [range(0, 3), range(3, 4)])):
        cfg = compose_point(["model=tiny", "model.n_layers=4", f"model.vocab_size={vocab}"])
        family = family_of(cfg.model)
        blocks, first, last = family.stage_costs(cfg.train.seq_len)
        assert first == 0 and last == 6 * cfg.model.hidden * vocab
        assert sum(blocks) + last == pytest.approx(family.counted(cfg.train.seq_len).flops_per_token)
        assert family.stages(cfg.train.seq_len, 2) == halves  # at 4096 the head costs more than two blocks
        assert family.stages(cfg.train.seq_len, 4) == [range(i, i + 1) for i in range(4)]
    assert peak_stage([3, 9, 5, 1], Layout(dp=2, pp=2)) == 0 and peak_stage([3, 1, 5, 1], Layout(dp=2, pp=2)) == 1


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["parallel.pp=3"],
            "parallel.pp=3 = 3 stages but model.n_layers=2 blocks: each stage holds at least one block",
        ),
        (["parallel.pp=2", "train.grad_acc=1"], "1F1B runs at least one micro-batch per stage; use grad_acc >= 2"),
        (
            ["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b", "parallel.pp_virtual=2", "train.grad_acc=2"],
            "parallel.pp=2 x parallel.pp_virtual=2 = 4 stages but model.n_layers=2 blocks",
        ),
        (
            ["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b", "train.grad_acc=2"],
            "parallel.pp_virtual=1 with parallel.pp_schedule=interleaved_1f1b: interleaving needs pp_virtual > 1",
        ),
        (
            ["parallel.pp=2", "parallel.pp_virtual=2", "train.grad_acc=2", "model.n_layers=4"],
            "parallel.pp_virtual=2 with parallel.pp_schedule=one_f_one_b: virtual stages need an interleaved schedule",
        ),
        (
            [
                "parallel.pp=2",
                "parallel.pp_schedule=interleaved_1f1b",
                "parallel.pp_virtual=2",
                "train.grad_acc=5",
                "model.n_layers=4",
            ],
            "train.grad_acc=5 with parallel.pp=2 and pp_schedule=interleaved_1f1b: the interleaved schedule runs "
            "max(1, grad_acc // pp) = 2 rounds",
        ),
        (
            ["parallel.pp=2", "train.grad_acc=2", "parallel.zero_stage=2", "parallel.dp=2"],
            "parallel.fsdp_grad_reduce=every_micro_step with parallel.pp=2 and zero_stage=2: torch's pipeline stages "
            "reduce-scatter FSDP2 gradients once",
        ),
        (["parallel.pp=2", "train.grad_acc=2", "model.tie_embeddings=true"], "model.tie_embeddings=true with"),
        (
            ["parallel.pp=2", "train.grad_acc=2", "parallel.dp=2", "parallel.dp_shard=1", "parallel.zero_stage=1"],
            "parallel.dp_shard=1 with parallel.pp=2: hybrid sharding is not run under pipeline stages",
        ),
    ],
    ids=[
        "blocks",
        "1f1b-microbatches",
        "virtual-blocks",
        "interleaved-virtual",
        "virtual-1f1b",
        "rounds",
        "fsdp",
        "tied",
        "hybrid",
    ],
)
def test_a_pipeline_that_cannot_run_is_refused_naming_the_field(overrides, expected):
    with pytest.raises(InvalidConfig) as err:
        validate(compose_point(["model=tiny", *overrides, "hardware.oversubscribe=true"]), host=False)
    assert expected in str(err.value)


def test_pipeline_ranks_count_against_the_host_cores():
    """pp × dp ranks of threads_per_device cores each on one host: refused past its cores, naming the product."""
    cfg = compose_point(["model=tiny", "parallel.pp=2", "parallel.dp=2", "train.grad_acc=2"])
    with pytest.raises(InvalidConfig) as err:
        validate(cfg, usable_cores=2)
    assert "parallel.dp=2 x parallel.pp=2 x hardware.threads_per_device=1 = 4 threads on one host" in str(err.value)
    assert validate(cfg, usable_cores=4).world_size == 4
