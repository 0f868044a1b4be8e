"""A torchrun script for the engine tests: the collectives one optimizer step issues, per case, from torch's profiler.

    python -m torch.distributed.run --standalone --nproc-per-node=4 -m tests.helpers.collective_counts IN.json OUT.json

IN.json lists cases, each {"name": ..., "config": a resolved experiment config with its `derived` block}, of any
world sizes up to the launch's: the cases of the largest run first on every rank, then the launch's first ranks leave
the process group for one of the next size (a file store beside OUT.json) and run its cases, and so on; so one launch
pays the ranks' start-up for cases of several sizes (the engine builds on the default process group). For each,
every rank builds the model with `parallelize`, runs untimed steps (the first makes the optimizer states and FSDP2's
lazy state; under DDP, ZeRO-0 and 1, a second, in whose forward DDP rebuilds its buckets, broadcasting the new bucket
order from rank 0, as the worker's warm-up absorbs it) and profiles exactly one `train_step` of grad_acc
micro-batches. Rank 0 writes
{name: {op: sorted bytes of each call}} to OUT.json. Only process-group calls made inside that step count (DDP's
construction broadcast, `param_norm`'s all-reduce and barriers lie outside it); DTensor's functional collectives
(`_c10d_functional::*`) reach the process group as the same `c10d::` ops, so they are counted once, there.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from scaling.core.schema import ExperimentConfig
from scaling.core.validate import validate
from scaling.engine.data import GlobalBatch, step_batches
from scaling.engine.parallel import parallelize
from scaling.engine.step import train_step
from scaling.model.llama.args import ModelArgs

OPS = {
    "c10d::allreduce_": "all_reduce",
    "c10d::broadcast_": "broadcast",
    "c10d::_allgather_base_": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",  # DTensor's gather of tensor parallelism's logits
}
"""Process-group ops (the dispatcher's names) as scaling.perf.step_model names them; any other `c10d::` op is kept
under its own name, so that the comparison shows it."""


def _bytes(arg: Any) -> int:
    """Bytes of one recorded argument: a tensor, a tensor list (summed), anything else 0."""
    if isinstance(arg, list):
        return sum(_bytes(a) for a in arg)
    sizes = getattr(arg, "sizes", None)
    return math.prod(sizes) * arg.dtype.itemsize if sizes is not None and arg.dtype is not None else 0


def _collectives(prof: profile) -> dict[str, list[int]]:
    """{op: bytes of each call} of the profiled region: a call moves its largest buffer (the all-reduced or
    broadcast tensors, the gathered output, the reduce-scatter's input)."""
    calls: dict[str, list[int]] = defaultdict(list)
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.name.startswith("c10d::"):
            args = getattr(event.extra_fields, "inputs", [])
            calls[OPS.get(event.name, event.name)].append(max(map(_bytes, args), default=0))
    return {op: sorted(sizes) for op, sizes in sorted(calls.items())}


def count_step(cfg: ExperimentConfig, rank: int) -> dict[str, list[int]]:
    """The collectives of one warm optimizer step of this case."""
    args, train = ModelArgs.of(cfg.model), cfg.train
    grad_acc = validate(cfg, host=False).grad_acc
    wrapped = parallelize(args, train, cfg.parallel, torch.device("cpu"))
    data = GlobalBatch(args.vocab_size, train.seq_len, train.seed)
    dp_rank = rank // cfg.parallel.tp  # a tensor-parallel group trains on one dp rank's rows
    untimed = 2 if cfg.parallel.zero_stage <= 1 else 1  # DDP's bucket rebuild in the second
    for step in range(untimed):
        train_step(wrapped, step_batches(data, step, dp_rank, train.mbs, grad_acc))
    batches = step_batches(data, untimed, dp_rank, train.mbs, grad_acc)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        train_step(wrapped, batches)
    return _collectives(prof)


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, launched = dist.get_rank(), dist.get_world_size()
    with open(sys.argv[1]) as f:
        cases = [(case["name"], ExperimentConfig.from_dict(case["config"])) for case in json.load(f)]
    counts: dict[str, dict[str, list[int]]] = {}
    for world in sorted({cfg.parallel.layout.world_size for _, cfg in cases}, reverse=True):
        if world > launched:
            raise SystemExit(f"a case of {world} ranks in a launch of {launched}: launch --nproc-per-node={world}")
        if world < dist.get_world_size():  # the first `world` ranks, in a process group of their own
            dist.destroy_process_group()
            if rank >= world:
                break
            dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}.{world}", rank=rank, world_size=world)
        counts.update({name: count_step(cfg, rank) for name, cfg in cases if cfg.parallel.layout.world_size == world})
    if rank == 0:
        with open(sys.argv[2], "w") as f:
            json.dump(counts, f)
    if dist.is_initialized():
        dist.destroy_process_group()
