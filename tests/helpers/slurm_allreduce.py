"""A torchrun script for the SLURM tests: all-reduce over gloo, rank 0 writes who took part to argv[1]."""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
nodes = [None] * dist.get_world_size()
dist.all_gather_object(nodes, os.environ.get("SLURMD_NODENAME", "?"))
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"world_size": dist.get_world_size(), "sum": total.item(), "nodes": nodes}, f)
dist.destroy_process_group()
