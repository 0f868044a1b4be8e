"""Collective micro-benchmark worker: times all-reduce, reduce-scatter and all-gather per message size.

Run under torchrun, one process per rank (gloo on CPU, NCCL on CUDA):

    torchrun --standalone --nproc-per-node=2 -m scaling.engine.collective_bench --sizes 4096,1048576 --out c.json

Rank 0 writes JSON with the node of every rank (SLURM's node name, else the host name) and, per
(op, size), the time of one call (median over iterations of the slowest rank) and the bandwidths
as nccl-tests defines them: algbw = size / time and busbw = algbw x 2(n-1)/n for all-reduce,
x (n-1)/n for reduce-scatter and all-gather, where size is the full buffer (all-reduce's tensor,
reduce-scatter's input, all-gather's output). `scaling collectives` runs it through the launchers.
Imports torch and the standard library only.
"""

from __future__ import annotations

import gc

if __name__ == "__main__":  # a rank: torch imported with the cyclic collector off (as scaling.engine.worker's are)
    gc.disable()

import argparse
import os
import platform
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from scaling.core.files import write_json_atomic

OPS = ("all_reduce", "reduce_scatter", "all_gather")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw ratio: the share of the buffer each rank sends over its link."""
    n = world_size
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def _call(op: str, numel: int, n: int, dtype: torch.dtype, device: torch.device, group: Any) -> Callable[[], None]:
    # numel is the full buffer, a multiple of n: the shard of one rank is numel // n elements
    if op == "all_reduce":
        buf = torch.ones(numel, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    if op == "reduce_scatter":
        inp = torch.ones(numel, dtype=dtype, device=device)
        out = torch.empty(numel // n, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    shard = torch.ones(numel // n, dtype=dtype, device=device)
    out = torch.empty(numel, dtype=dtype, device=device)
    return lambda: dist.all_gather_into_tensor(out, shard, group=group)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def strided_group(stride: int) -> Any:
    """This rank's ring of ranks a `stride` apart ({i, i + stride, ...}: the replicas of one shard under hybrid
    sharding); every rank makes every group, as new_group requires. None for stride 1 (every rank)."""
    if stride <= 1:
        return None
    world, mine = dist.get_world_size(), None
    for first in range(stride):
        group = dist.new_group(list(range(first, world, stride)))
        if dist.get_rank() % stride == first:
            mine = group
    return mine


def time_op(
    op: str,
    size_bytes: int,
    iters: int,
    warmup: int,
    dtype: torch.dtype,
    device: torch.device,
    group: Any = None,
    stride: int = 1,
) -> dict[str, Any]:
    """Time one collective on a buffer of about `size_bytes` over `group` (every rank's own ring of ranks `stride`
    apart, all rings at once; None: every rank); every rank must call it."""
    n = dist.get_world_size(group)
    elem = torch.tensor([], dtype=dtype).element_size()
    numel = max(n, -(-size_bytes // (elem * n)) * n)  # round up to a whole shard per rank
    fn = _call(op, numel, n, dtype, device, group)
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        fn()
        _sync(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
        times.append(float(elapsed.item()))
    size = numel * elem
    time_s = statistics.median(times)
    algbw = size / time_s
    return {
        "op": op,
        "world_size": n,
        **({"stride": stride} if stride > 1 else {}),
        "size_bytes": size,
        "time_s": time_s,
        "times_s": times,
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": algbw * bus_factor(op, n),
    }


def _positive_ints(flag: str, noun: str, unit: str, example: str) -> Callable[[str], list[int]]:
    """An argparse type: a comma-separated list of positive integers, refused naming `flag` and what each one is."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(s) for s in text.split(",") if s]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag}={text!r}: give {unit}s separated by commas, e.g. {example}"
            ) from None
        if min(values, default=0) < 1:
            raise argparse.ArgumentTypeError(f"{flag}={text!r}: every {noun} must be a positive {unit}")
        return values

    return parse


_sizes = _positive_ints("--sizes", "size", "byte count", "4096,65536")
_strides = _positive_ints("--stride", "stride", "rank distance", "2,8")


def _ops(text: str) -> list[str]:
    ops = [s for s in text.split(",") if s]
    bad = [op for op in ops if op not in OPS]
    if bad or not ops:
        raise argparse.ArgumentTypeError(f"--ops={text!r}: choose from {', '.join(OPS)}")
    return ops


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of the worker."""
    p = argparse.ArgumentParser(prog="python -m scaling.engine.collective_bench", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=_sizes, required=True, help="message sizes in bytes, comma-separated")
    p.add_argument("--ops", type=_ops, default=list(OPS), help=f"collectives, comma-separated: {','.join(OPS)}")
    p.add_argument("--iters", type=int, default=10, help="timed calls per (op, size)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl on CUDA, else gloo")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument(
        "--stride",
        type=_strides,
        default=[1],
        help="also time rings of ranks this far apart, all at once, for each distance given (comma-separated): "
        "tensor parallelism's dp rings (tp apart), hybrid sharding's replicas (dp_shard × tp apart)",
    )
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error(f"--iters={args.iters} must be >= 1 and --warmup={args.warmup} >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    """Entry point of each rank."""
    args = parse_args(argv)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)
    try:
        results = [
            time_op(op, size, args.iters, args.warmup, DTYPES[args.dtype], device)
            for op in args.ops
            for size in args.sizes
        ]
        for stride in sorted({s for s in args.stride if s > 1}):
            group = strided_group(stride)
            results += [
                time_op(op, size, args.iters, args.warmup, DTYPES[args.dtype], device, group, stride)
                for op in args.ops
                for size in args.sizes
            ]
        nodes: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(nodes, os.environ.get("SLURMD_NODENAME", platform.node()))
        if dist.get_rank() == 0:
            doc = {
                "backend": backend,
                "world_size": dist.get_world_size(),
                "dtype": args.dtype,
                "device": torch.cuda.get_device_name(device)
                if device.type == "cuda"
                else platform.processor() or platform.machine(),
                "torch": torch.__version__,
                "hostname": platform.node(),
                "nodes": nodes,
                "results": results,
            }
            write_json_atomic(args.out, doc)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    gc.freeze()  # what the imports made; the collector is back on for the timed calls, as in any process
    gc.enable()
    main()
