"""Reference for bench_engine: the plainest DDP training loop on the same model and batch shape.

torchrun --standalone --nproc-per-node=N benchmarks/bare_ddp.py OUT.json MODEL_JSON SEQ MBS STEPS WARMUP THREADS
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from scaling.model.llama.args import ModelArgs
from scaling.model.llama.decoder import Transformer


def main() -> None:
    out, model_json, seq, mbs, steps, warmup, threads = sys.argv[1:8]
    seq, mbs, steps, warmup, threads = int(seq), int(mbs), int(steps), int(warmup), int(threads)
    torch.set_num_threads(threads)
    cores = sorted(os.sched_getaffinity(0))  # pinned like a scaling rank: cores of its own
    rank = int(os.environ["LOCAL_RANK"])
    os.sched_setaffinity(0, [cores[(rank * threads + i) % len(cores)] for i in range(threads)])
    dist.init_process_group("gloo")
    args = ModelArgs.from_dict(json.loads(model_json))
    model = Transformer(args)
    model.init_weights(0)
    ddp = DDP(model, gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    batch = torch.randint(0, args.vocab_size, (mbs, seq + 1), generator=g)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        logits = ddp(batch[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()).backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    all_times = [None] * dist.get_world_size()
    dist.all_gather_object(all_times, times)
    if dist.get_rank() == 0:
        step_times = [max(ts) for ts in zip(*all_times)]
        with open(out, "w") as f:
            json.dump({"step_time_s": statistics.median(step_times)}, f)
    dist.barrier()
    os._exit(0)  # same exit as scaling.engine.worker: no teardown of the DDP reducer's gloo group


if __name__ == "__main__":
    main()
