"""What each torchrun rank runs: train a few steps of one experiment point and measure it.

    torchrun --standalone --nproc-per-node=<dp> -m scaling.engine.worker <job_dir>/config.json

Reads the resolved config (JSON), joins the process group (gloo on CPU with this rank's share of
the cores, nccl on CUDA), runs the untimed warm-up steps (on CPU the last of them, at least the
second step, runs under the memory tracker), then the timed steps. Rank 0 writes `worker.json` (step times, losses, peak memory per rank, final
parameter norm, environment) next to the config; the parent turns it into result.json.
The entry point is wrapped in torch elastic's `@record`, so an exception in any rank lands in an
error file the parent classifies (an out-of-memory error gives status `oom`).

torch and the standard library only: this must run on a bare GPU box.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record

from scaling.engine.data import GlobalBatch, micro_batch
from scaling.engine.lifetime import die_with_parent
from scaling.engine.memtrack import tracked_step
from scaling.engine.model import ModelArgs, Transformer
from scaling.engine.parallel import Parallelized, parallelize
from scaling.engine.jobfiles import WORKER_OUTPUT, write_json_atomic


GIB = 1024**3


def _setup_device(cfg: dict[str, Any], local_rank: int) -> tuple[torch.device, str]:
    """Pick this rank's device, cap CUDA memory when asked; return (device, memory_capacity kind)."""
    hw = cfg["hardware"]
    if hw["device"] == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if hw["memory_gb"] is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, hw["memory_gb"] * GIB / total), device)
        return device, "real"
    torch.set_num_threads(cfg["runtime"]["threads_per_rank"])
    return torch.device("cpu"), "emulated" if hw["memory_gb"] is not None else "unlimited"


def _inject_fault(kind: str, rank: int, world: int) -> None:
    """Fault injection for resilience tests: the last rank crashes or hangs on the first step."""
    if kind == "none" or rank != world - 1:
        return
    if kind == "crash":
        raise RuntimeError(f"injected fault: rank {rank} crashed on purpose (train.fault=crash)")
    while True:  # kind == "hang": the other ranks wait in their next collective forever
        time.sleep(3600)


def train_step(
    pz: Parallelized, data: GlobalBatch, step: int, dp_rank: int, mbs: int, grad_acc: int,
    before_micro: Optional[Callable[[], None]] = None,
) -> torch.Tensor:
    """One optimizer step over this rank's grad_acc micro-batches; returns the rank's mean loss."""
    pz.optimizer.zero_grad(set_to_none=True)
    step_loss = torch.zeros((), device=pz.device)
    for micro in range(grad_acc):
        if before_micro is not None:
            before_micro()
        inputs, targets = micro_batch(data, step, dp_rank, micro, mbs, grad_acc, pz.device)
        with pz.sync_gradients(micro == grad_acc - 1):
            with pz.autocast():
                logits = pz.model(inputs)  # (mbs, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) / grad_acc
            loss.backward()
        step_loss += loss.detach()
    pz.optimizer.step()
    return step_loss


def _gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """All ranks' lists of floats (same length on every rank), indexed [rank][i]."""
    local = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return [t.tolist() for t in out]


def run(cfg: dict[str, Any], job_dir: Path) -> None:
    """Train and measure one experiment point as this rank."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device, capacity_kind = _setup_device(cfg, local_rank)
    hw, train, par, derived = cfg["hardware"], cfg["train"], cfg["parallel"], cfg["derived"]
    phases: dict[str, float] = {}
    mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = now - mark
        mark = now

    dist.init_process_group(hw["backend"], device_id=device if device.type == "cuda" else None)
    phase("init_process_group_s")

    args = ModelArgs.from_dict(cfg["model"])
    # On CUDA build shapes on the meta device and allocate once on the GPU. On CPU build in place:
    # initialising meta tensors imports the compiler stack (a second or more of every rank's start).
    model = Transformer(args, recompute=train["recompute"] == "full", device="meta" if device.type == "cuda" else device)
    if device.type == "cuda":
        model.to_empty(device=device)
    model.init_weights(train["seed"])
    if train["compile"]:
        for block in model.layers:
            block.compile()
    pz = parallelize(
        model, par["zero_stage"], device, precision=train["precision"], bucket_mb=par["bucket_mb"],
        lr=train["lr"], weight_decay=train["weight_decay"],
    )
    data = GlobalBatch(args.vocab_size, train["seq_len"], train["seed"], **train["data"])
    mbs, grad_acc = train["mbs"], derived["grad_acc"]
    step, losses = 0, []

    def one_step(before_micro: Optional[Callable[[], None]] = None) -> None:
        nonlocal step
        losses.append(train_step(pz, data, step, rank, mbs, grad_acc, before_micro))
        step += 1

    phase("build_s")
    _inject_fault(train["fault"], rank, world)
    peak_bytes, breakdown = 0, {}
    if device.type == "cpu":
        # The last untimed step is the memory-tracked one; at least one plain step comes first so
        # that optimizer states already exist, as they do in every later step.
        for _ in range(max(train["warmup_steps"], 2) - 1):
            one_step()
        phase("warmup_s")
        capacity = None if hw["memory_gb"] is None else int(hw["memory_gb"] * GIB)
        with tracked_step(pz.model, pz.optimizer, par["zero_stage"] >= 2, capacity) as peak:
            one_step(peak.new_micro_step)
        peak_bytes, breakdown = peak.peak_bytes, peak.breakdown
        phase("memory_step_s")
    else:
        for _ in range(train["warmup_steps"]):
            one_step()
        torch.cuda.synchronize(device)
        phase("warmup_s")

    step_times: list[float] = []
    dist.barrier()
    window_start = time.perf_counter()
    for _ in range(train["steps"]):
        t0 = time.perf_counter()
        one_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_times.append(time.perf_counter() - t0)
    window_s = time.perf_counter() - window_start

    mem = [float(peak_bytes), 0.0, 0.0, 0.0]
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        mem = [float(torch.cuda.max_memory_allocated(device)), float(torch.cuda.max_memory_reserved(device)),
               float(stats.get("num_ooms", 0)), float(stats.get("num_alloc_retries", 0))]
    step_losses = torch.stack(losses).double()
    dist.all_reduce(step_losses)  # sum of per-rank means -> divided by world below
    times_by_rank = _gather_floats(step_times, device)
    mem_by_rank = _gather_floats(mem, device)
    norm = pz.param_norm()
    if rank == 0:
        write_json_atomic(job_dir / WORKER_OUTPUT, {
            "losses": (step_losses / world).tolist(),
            "step_times_s": [max(ts) for ts in zip(*times_by_rank)],
            "measured_window_s": window_s,
            "final_param_norm": norm,
            "peak_mem_bytes_per_rank": [int(m[0]) for m in mem_by_rank],
            "peak_mem_reserved_bytes_per_rank": [int(m[1]) for m in mem_by_rank] if device.type == "cuda" else None,
            "num_ooms": int(sum(m[2] for m in mem_by_rank)),
            "num_alloc_retries": int(sum(m[3] for m in mem_by_rank)),
            "peak_mem_breakdown_rank0": breakdown or None,
            "phases_s": phases,
            "env": {
                "torch": torch.__version__,
                "python": platform.python_version(),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
                "backend": hw["backend"],
                "hostname": socket.gethostname(),
                "threads_per_rank": torch.get_num_threads(),
                "memory_capacity": capacity_kind,
                "world_size": world,
            },
        })
    dist.barrier()
    # Leave without tearing down: freeing the DDP reducer's gloo group while its worker thread
    # still waits for the GIL to release a finished work's tensors deadlocks the exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@record
def main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: `python -m scaling.engine.worker <job_dir>/config.json`."""
    die_with_parent()  # no rank outlives its torchrun agent
    argv = sys.argv[1:] if argv is None else argv
    config_path = Path(argv[0])
    cfg = json.loads(config_path.read_text())
    run(cfg, config_path.parent)


if __name__ == "__main__":
    main()
