"""The engine's memory by construction, measured on CPU: shard before materialising, peaks apart from the
build, ZeRO-2/3 accumulation in shards, ZeRO-1's real partition, and what actually ran."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scaling.core.schema import ExperimentConfig
from scaling.engine import kernels
from scaling.engine.device import PROFILE_TOLERANCE, profile_note, rank_cores
from scaling.engine.memtrack import ResidentMemory
from scaling.model.llama.args import ModelArgs, param_count
from scaling.predictor.analytic import predict_config
from scaling.predictor.model_state import Shapes, zero1_worst_rank
from scaling.predictor.prescreen import capacity_bytes
from tests.helpers.compose import compose_point
from tests.helpers.points import CLIP, FRESH, point

pytestmark = pytest.mark.torchrun  # its points run on torchrun ranks (the session's point store)

MIB = 2**20
# 142M parameters (570 MB in fp32) in many tensors of at most 16 MB: ZeRO-3 over 2 ranks must never
# hold the whole model on one rank while building it. One timed step of 8 tokens after the CPU floor of two warm-up
# steps (the default three: a step of this model is 3.5 s of a rank's CPU): the build is what is measured, and
# the steps' matmuls are the least of them. bf16: the build is the same (FSDP2 keeps fp32 shards), the steps'
# all-gathers move half the bytes (the point's CPU 36-42 s -> 28-32 s); with fewer layers the build's fixed ~90 MiB
# would no longer be small beside the model.
FAT = [
    "train.precision=bf16",
    "model=small",
    "model.hidden=1024",
    "model.n_layers=8",
    "model.n_heads=8",
    "model.n_kv_heads=8",
    "model.ffn_hidden=4096",
    "model.vocab_size=4096",
    "train.seq_len=8",
    "train.mbs=1",
    "train.warmup_steps=2",
    "train.steps=1",
    "launch.timeout_s=300",
]


@pytest.fixture
def sweep_dir(point_store):
    """The session's store of real points (tests/helpers/points.py): test_engine.py's DP-split points serve here too."""
    return point_store


def test_zero3_builds_only_each_ranks_shard_plus_one_parameter(sweep_dir):
    rec = point(sweep_dir, *FAT, "parallel.dp=2", "parallel.zero_stage=3", FRESH)  # resident memory: fresh ranks
    assert rec["status"] == "ok", rec["error"]
    args = ModelArgs.from_dict(rec["config"]["model"])
    full = 4 * param_count(args)
    largest = 4 * args.ffn_hidden * args.hidden
    build = rec["metrics"]["build_peak_mem_bytes_per_rank"]
    assert len(build) == 2
    # Resident growth while building, from the OS: the shard, one parameter whole, and a fixed part beside them (the
    # allocator's arenas, FSDP2's copies, gloo's buffers): about 90 MiB on one Xeon, 102 MiB on another. A rank that
    # built the whole model before sharding it grows by 544 MiB and more.
    for rank_bytes in build:
        assert rank_bytes <= full / 2 + largest + 128 * MIB, (rank_bytes / MIB, full / MIB)
        assert rank_bytes < 0.8 * full
    # The training peak is measured apart from the build: the tracked step's live tensors.
    assert rec["metrics"]["peak_mem_source"] == "mem_tracker"
    assert rec["metrics"]["peak_rss_growth_bytes"] >= rec["metrics"]["peak_mem_bytes"] * 0.8


def test_resident_peak_is_reset_between_phases():
    """The CPU stand-in for resetting CUDA's peak after building: a freed 256 MiB no longer counts."""
    resident = ResidentMemory()
    assert resident.available
    big = torch.ones(64 * MIB)  # 256 MiB, touched
    del big
    assert resident.peak_growth_bytes() >= 250 * MIB
    resident.reset_peak()
    small = torch.ones(8 * MIB)  # 32 MiB
    assert 24 * MIB <= resident.peak_growth_bytes() < 100 * MIB
    del small


@pytest.mark.parametrize("stage", [2, 3])
def test_zero23_accumulate_gradients_in_shards(sweep_dir, stage):
    """grad_acc=2 adds the fp32 gradient shards (4Ψ/dp), not unsharded gradients (4Ψ), unless asked."""
    # seq_len 64, mbs 2; clipping at 0.05 (real runs clip too, at 1.0: the same buffers) makes "sharded" the
    # DP-split point of test_engine.py, run once for both
    common = ["parallel.dp=2", f"parallel.zero_stage={stage}", CLIP]
    psi = param_count(ModelArgs.of(compose_point(["model=tiny"]).model))
    peaks = {}
    for label, extra in {
        "ga1": ["train.grad_acc=1"],
        "sharded": ["train.grad_acc=2"],
        "unsharded": ["train.grad_acc=2", "parallel.fsdp_grad_reduce=last_micro_step"],
    }.items():
        rec = point(sweep_dir, *common, *extra)
        assert rec["status"] == "ok", rec["error"]
        peaks[label] = rec["metrics"]["peak_mem_bytes"]
        # each rank's own shard of AdamW's m and v (8 bytes a parameter, over 2 ranks), not the whole model's
        state = rec["metrics"]["optimizer_state_bytes_per_rank"]
        assert all(8 * psi / 2 <= s <= 8 * psi / 2 * 1.01 for s in state), (state, 8 * psi)
    assert peaks["sharded"] - peaks["ga1"] <= 4 * psi / 2 * 1.1, peaks
    assert peaks["unsharded"] - peaks["ga1"] >= 4 * psi * 0.9, peaks


def test_zero1_worst_rank_is_predicted_from_torchs_partition(sweep_dir):
    rec = point(sweep_dir, "parallel.dp=2", "train.grad_acc=2", "parallel.zero_stage=1", CLIP)  # the DP-split point
    assert rec["status"] == "ok", rec["error"]
    measured = rec["metrics"]["optimizer_state_bytes_per_rank"]
    args = ModelArgs.from_dict(rec["config"]["model"])
    shapes = Shapes(
        args.n_layers,
        args.hidden,
        args.n_kv_heads * args.hd,
        args.ffn_hidden,
        args.n_heads,
        args.hd,
        args.vocab_size,
        args.tie_embeddings,
        64,
        2,
    )
    numel, tensors = zero1_worst_rank(shapes, 2)
    assert max(measured) == 8 * numel + 4 * tensors  # AdamW m and v, and a 4-byte step per tensor
    assert max(measured) > 8 * param_count(args) / 2  # whole tensors: the worst rank holds more than Ψ/dp


def test_ddp_bucket_rebuild_in_the_second_step_is_predicted(sweep_dir):
    """DDP rebuilds its gradient buckets in the second step's forward while the gradients still live in the old
    ones: with activations this small that is the step's peak (parameters, both bucket sets, optimizer states), and
    the analytic prediction says so to the byte's order (it was 4Ψ short before it knew)."""
    rec = point(sweep_dir, "parallel.dp=2", "train.seq_len=16", "train.mbs=1", "parallel.zero_stage=1")
    assert rec["status"] == "ok", rec["error"]
    predicted = predict_config(ExperimentConfig.from_dict(rec["config"]), grad_acc=rec["derived"]["grad_acc"])
    assert predicted.phase == "bucket_rebuild"
    assert abs(predicted.total_bytes / max(rec["metrics"]["peak_mem_bytes_per_rank"]) - 1) < 0.001
    psi = param_count(ModelArgs.from_dict(rec["config"]["model"]))
    assert rec["metrics"]["peak_mem_breakdown_rank0"]["_MemRefType.ACT"] >= 4 * psi  # the new buckets, in forward


def test_record_says_which_attention_kernel_ran(sweep_dir):
    rec = point(sweep_dir, "parallel.dp=1", "train.grad_acc=4", CLIP)  # test_engine.py's DP-split point at dp=1
    assert rec["env"]["attention_kernel"] == "flash (cpu)" and rec["env"]["compile"] is False
    assert rec["env"]["warmup_steps_run"] == 2 and rec["metrics"]["compile_s"] is None
    # The watch on the first training step tells kernels apart: with the fused kernel ruled out, SDPA falls
    # back to the math one; a step without attention names none.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, kv = torch.randn(1, 4, 32, 16, requires_grad=True), torch.randn(2, 1, 2, 32, 16)  # (B, nh, T, hd)

    def attend():
        F.scaled_dot_product_attention(q, kv[0], kv[1], is_causal=True, enable_gqa=True).sum().backward()

    with kernels.AttentionWatch() as fused:
        attend()
    with sdpa_kernel(SDPBackend.MATH), kernels.AttentionWatch() as math:
        attend()
    with kernels.AttentionWatch() as none:
        q.sum().backward()
    assert (fused.kernel, math.kernel, none.kernel) == ("flash (cpu)", kernels.MATH, None)


def test_capacity_is_what_the_device_states_less_a_reserve():
    h100 = compose_point(["hardware=h100", "train.precision=bf16"])
    assert capacity_bytes(h100.hardware) == int((h100.hardware.memory_gb - h100.hardware.reserve_gb) * 2**30)
    total = 85_017_493_504  # what torch reports for an "80 GB" H100 (79.18 GiB)
    assert profile_note(h100.hardware.memory_gb, "NVIDIA H100 80GB HBM3", total) is None  # the profile is the card
    datasheet = profile_note(80.0, "NVIDIA H100 80GB HBM3", total)  # 1% over what the card has
    assert datasheet and "hardware.memory_gb=80 GiB" in datasheet and "79.18 GiB" in datasheet
    note = profile_note(141.0, "NVIDIA H100 80GB HBM3", total)
    assert note and "hardware.memory_gb=141 GiB" in note and "the card decides" in note
    assert PROFILE_TOLERANCE <= 0.005


def test_ranks_get_cores_of_their_own():
    assert [rank_cores(r, 1, [0, 1]) for r in (0, 1)] == [[0], [1]]
    assert [rank_cores(r, 2, [4, 5, 6, 7]) for r in (0, 1)] == [[4, 5], [6, 7]]
    assert rank_cores(2, 1, [0, 1]) == [0]  # oversubscribed: wraps around


def test_a_step_that_fails_under_the_attention_watch_says_its_error_before_the_profiler_stops(capfd):
    """A rank whose first step fails (a collective timed out waiting for a hung peer) prints the error before the
    profiler is stopped, which has aborted the process with its heap corrupted before the rank wrote its error file:
    the launch then reads the timeout from the log (scaling.launch.torchrun.classify)."""
    timed_out = "[gloo/unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation to complete"
    with pytest.raises(RuntimeError, match="Timed out waiting"), kernels.AttentionWatch() as watch:
        F.scaled_dot_product_attention(*(torch.randn(1, 2, 4, 8) for _ in range(3)))
        raise RuntimeError(timed_out)
    assert watch.kernel is None
    err = capfd.readouterr().err.splitlines()  # torch's profiler says when it starts and stops, on this build
    said = err.index(f"RuntimeError: {timed_out}")
    assert all("profiler_stop" not in line for line in err[:said])
