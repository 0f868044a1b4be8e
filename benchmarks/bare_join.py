"""Reference for bench_engine's launch overhead: import torch, join a gloo group, leave."""

import os

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
os._exit(0)  # same exit as scaling.engine.worker
