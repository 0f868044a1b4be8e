"""The traced predictor: fake tensors and a fake process group against real torchrun runs, and its isolation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param
from torch.distributed._tools.mem_tracker import MemTracker

from scaling.job.run import run_point
from scaling.model.llama.args import ModelArgs, param_count, param_shapes
from scaling.predictor import analytic as memory
from scaling.predictor.trace import TraceError, trace_peak
from tests.helpers.compose import compose_point
from tests.helpers.points import BASE, CLIP

pytestmark = pytest.mark.torchrun  # its points run on torchrun ranks (the session's point store)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_traced_matches_measured_run(point_store, stage):
    """Against test_engine.py's DP-split points (2 ranks, 2 micro-steps), from the session's store."""
    cfg = compose_point([*BASE, "parallel.dp=2", "train.grad_acc=2", f"parallel.zero_stage={stage}", CLIP], point_store)
    measured = run_point(cfg)
    assert measured["status"] == "ok", measured["error"]
    traced = trace_peak(cfg)
    peak = measured["metrics"]["peak_mem_bytes"]
    assert abs(traced.peak_mem_bytes - peak) / peak <= 0.10, (traced.peak_mem_bytes, peak)
    assert sum(traced.breakdown.values()) == traced.peak_mem_bytes  # the categories at the peak add up


def test_traced_ddp_step_holds_the_bucket_rebuild_a_real_run_holds(point_store):
    """A point whose peak is DDP's one bucket rebuild (in the second step's first forward the new buckets are made while
    the old ones hold the gradients): the trace makes the rebuild's bytes without the other ranks and meets the
    tracker of a real two-rank run, and the analytic model names the phase."""
    cfg = compose_point(
        [*BASE, "parallel.dp=2", "train.seq_len=16", "train.mbs=1", "parallel.zero_stage=0"], point_store
    )
    measured = run_point(cfg)
    assert measured["status"] == "ok", measured["error"]
    peak = measured["metrics"]["peak_mem_bytes"]
    assert memory.predict_config(cfg).phase == "bucket_rebuild"
    assert abs(trace_peak(cfg).peak_mem_bytes - peak) / peak <= 0.001, (trace_peak(cfg).peak_mem_bytes, peak)


@pytest.mark.parametrize(
    "tied, point, phase",
    [
        ("false", ["parallel.zero_stage=2", "train.grad_acc=4"], "root_reduce"),
        ("true", ["parallel.zero_stage=3", "train.grad_acc=1"], "embedding_backward"),
    ],
)
def test_the_end_of_an_fsdp_backward_is_predicted_as_a_real_run_holds_it(point_store, tied, point, phase):
    """Points whose peak is the last moment of an FSDP2 backward (a 4096 vocabulary, recomputation, one sample):
    untied, at ZeRO-2 with 4 micro-steps, the root reducing its gradients beside every still-gathered parameter and
    the shards accumulated so far, through gloo's reduce-scatter, which reduces a copy of its whole input; tied, the
    embedding's gradient added to the output projection's on the shared weight. Both predictors meet the tracker of a
    real two-rank run, to within one block's fp32 reduce-scatter buffer: gloo's copy of it is freed on gloo's thread
    at its own time, before or after the main thread's next allocation (docs/concepts.md, "Warm ranks")."""
    model = ["model.vocab_size=4096", "model.hidden=128", f"model.tie_embeddings={tied}"]
    cfg = compose_point([*BASE, *model, "parallel.dp=2", "train.mbs=1", "train.recompute=full", *point], point_store)
    measured = run_point(cfg)
    assert measured["status"] == "ok", measured["error"]
    peak = measured["metrics"]["peak_mem_bytes"]
    args = ModelArgs.of(cfg.model)
    block = sum(rows * cols for _, in_block, rows, cols in param_shapes(args) if in_block) // args.n_layers
    race = 4 * block  # one block's fp32 reduce-scatter buffer
    analytic, traced = memory.predict_config(cfg), trace_peak(cfg).peak_mem_bytes
    assert analytic.phase == phase
    for predicted in (analytic.total_bytes, traced):
        assert -0.001 * peak - race <= predicted - peak <= 0.001 * peak, (predicted, peak, race)


def test_trace_leaves_the_process_as_it_found_it():
    patched = (MemTracker._update_peak_stats, fsdp_param._chunk_with_empty, sys.excepthook)
    trace_peak(compose_point(["model=tiny", "parallel.dp=4", "parallel.zero_stage=3"]))
    assert not dist.is_initialized()
    # sys.excepthook too: init_process_group leaves a hook that prefixes "[rank0]: ", one more per trace
    assert (MemTracker._update_peak_stats, fsdp_param._chunk_with_empty, sys.excepthook) == patched
    assert not isinstance(torch.empty(1), torch._subclasses.fake_tensor.FakeTensor)


def test_trace_leaves_the_environment_of_a_fresh_process_as_it_found_it():
    """The sweep driver's first trace imports the parts of torch that set TORCHINDUCTOR_CACHE_DIR in the process's
    environment; a changed environment would make the driver's next point another warm job (new ranks)."""
    script = (
        "import json, os; before = dict(os.environ)\n"
        "from scaling.predictor.trace import trace_peak\n"
        "from tests.helpers.compose import compose_point\n"
        "trace_peak(compose_point(['model=tiny', 'parallel.dp=2', 'parallel.zero_stage=1']))\n"
        "print(json.dumps(sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_trace_refuses_a_process_that_has_a_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(TraceError, match="needs a process without a process group"):
            trace_peak(compose_point(["model=tiny"]))
    finally:
        dist.destroy_process_group()


def test_large_model_is_traced_without_allocating_it():
    """llama_1b, 8 ranks, ZeRO-3: ~40 GiB of fp32 state across ranks, predicted on fake tensors."""
    cfg = compose_point(
        [
            "model=llama_1b",
            "train.seq_len=512",
            "train.mbs=1",
            "parallel.dp=8",
            "parallel.zero_stage=3",
            "train.precision=bf16",
            "hardware=h100",
        ]
    )
    traced = trace_peak(cfg)
    psi = param_count(ModelArgs.of(cfg.model))
    assert traced.breakdown["opt"] >= 8 * psi // 8  # AdamW m and v of this rank's shard
    assert 1 * 2**30 < traced.peak_mem_bytes < 40 * 2**30


def test_an_fsdp_point_is_traced_on_the_cpu_on_a_host_with_an_accelerator(monkeypatch):
    """torch's default FSDP2 mesh is the host's accelerator's; the trace builds on the CPU, so its mesh must be the
    CPU's (on an H100 host every ZeRO-3 trace failed: "Expects the parameter to already be moved to device cuda:0")."""
    cfg = compose_point(["model=tiny", "parallel.dp=2", "parallel.zero_stage=3"])
    on_this_host = trace_peak(cfg).peak_mem_bytes
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    assert trace_peak(cfg).peak_mem_bytes == on_this_host


UNEVEN = """\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 24), nn.Linear(24, 16)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    # tied: the embedding (512 elements) the largest tensor, then four of 384
    def __init__(self, vocab_size=32, max_seq_len=16):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 16)
        self.h = nn.ModuleList(Block() for _ in range(2))

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.h:
            x = block(x)
        return x @ self.emb.weight.t()
"""


def test_zero1_is_traced_as_the_rank_that_holds_the_most_optimizer_state(tmp_path, monkeypatch):
    """ZeroRedundancyOptimizer gives whole tensors, largest first, to the least loaded rank: here rank 0 the
    embedding, a matmul and the biases (976 elements), rank 1 three matmuls (1,152), so the trace is rank 1's (it was
    rank 0's, under the worst rank docs/memory.md promises): AdamW's m and v of its elements and a step per tensor."""
    from scaling.core.schema import ExperimentConfig
    from scaling.predictor.model_state import zero1_partition

    (tmp_path / "uneven.py").write_text(UNEVEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = {"name": "uneven", "_target_": "uneven.Model", "vocab_size": 32, "max_seq_len": 16}
    cfg = ExperimentConfig.from_dict({"model": model}).changed(
        train={"seq_len": 16, "mbs": 2}, parallel={"dp": 2, "zero_stage": 1}, logger={"name": "none"}
    )
    numels = [p.numel() for p in __import__("uneven").Model().parameters()]
    parts = zero1_partition(tuple(numels), 2)
    assert parts == ((512, 384, 24, 24, 16, 16), (384, 384, 384)), parts
    worst = parts[1]
    assert trace_peak(cfg).breakdown["opt"] == 8 * sum(worst) + 4 * len(worst)
