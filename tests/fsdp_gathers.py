"""A torchrun script for the engine tests: how many all-gathers and reduce-scatters one ZeRO-2/3 optimizer step
of the tiny model makes at grad_acc=3, per stage and fsdp_grad_reduce, counted from torch's profiler; rank 0
writes them as JSON to argv[1]."""

from __future__ import annotations

import json
import sys
from collections import Counter

import torch
import torch.distributed as dist

from scaling.engine.data import GlobalBatch, step_batches
from scaling.engine.model_config import ModelArgs
from scaling.engine.parallel import parallelize
from scaling.engine.step import train_step
from tests.compose import compose_point

if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, counts = dist.get_rank(), {}
    for stage in (2, 3):
        for reduce in ("every_micro_step", "last_micro_step"):
            cfg = compose_point(["model=tiny", f"parallel.zero_stage={stage}", f"parallel.fsdp_grad_reduce={reduce}"])
            args = ModelArgs.from_dict(cfg["model"])
            wrapped = parallelize(args, cfg["train"], cfg["parallel"], torch.device("cpu"))
            data = GlobalBatch(args.vocab_size, 16, 0)
            train_step(wrapped, step_batches(data, 0, rank, 1, 3))  # the first step makes the optimizer states
            with torch.autograd.profiler.profile(use_kineto=False) as prof:
                train_step(wrapped, step_batches(data, 1, rank, 1, 3))
            ops = Counter(e.name for e in prof.function_events)
            counts[f"{stage}/{reduce}"] = [ops["c10d::_allgather_base_"], ops["c10d::_reduce_scatter_base_"]]
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(counts, f)
    dist.destroy_process_group()
