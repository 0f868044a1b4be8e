"""ZeRO-1 against ZeRO-0 at dp=1: what each holds at its peak, step by step, with either AdamW the engine uses.

    python benchmarks/bench_zero1_memory.py [--model small] [--seq-len 64] [--mbs 2] [--steps 3]

At dp=1 the two stages hold the same tensors by every account (DDP's buckets, the same AdamW states over the same
parameters), yet on the H100 page (benchmarks/gpu/, 2026-11-22) ZeRO-1 peaked 4 bytes per parameter (4Ψ) above
ZeRO-0 (on the H200 page, the final tree, 2026-11-30, it did not). This runs both stages in one process (world size 1) through the engine's own `parallelize` and `train_step`, from the
end of the build through every step, as a CUDA run's `max_memory_allocated` counts them: on CPU under torch's
memory tracker (live tensor bytes) with single-tensor AdamW (the engine's on CPU) and with fused AdamW (the engine's
on CUDA, whose kernel torch also has for CPU); on CUDA with the allocator's own peak and fused AdamW. Prints each
stage's peak after each step in units of Ψ and ZeRO-1's excess over ZeRO-0 (in Ψ and in bytes). Asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from scaling.core.schema import ExperimentConfig  # noqa: E402
from scaling.core.validate import validate  # noqa: E402
from scaling.engine.data import GlobalBatch, step_batches  # noqa: E402
from scaling.engine.memtrack import load_trackers  # noqa: E402
from scaling.engine.parallel import load_wrappers, parallelize  # noqa: E402
from scaling.engine.step import train_step  # noqa: E402
from scaling.model.llama.args import ModelArgs  # noqa: E402
from scaling.sweep.compose import compose_config  # noqa: E402


def peaks_per_step(cfg: ExperimentConfig, device: torch.device, fused: bool, steps: int) -> tuple[int, list[int]]:
    """Ψ and the peak bytes from the end of the build to the end of each step (a running maximum)."""
    train, parallel, grad_acc = cfg.train, cfg.parallel, validate(cfg, host=False).grad_acc
    load_wrappers(parallel.layout)
    args = ModelArgs.of(cfg.model)
    wrapped = parallelize(args, train, parallel, device, fused_optimizer=fused)
    psi = sum(p.numel() for p in wrapped.model.parameters())
    data = GlobalBatch(args.vocab_size, train.seq_len, train.seed, **dataclasses.asdict(train.data))
    batches = [step_batches(data, step, 0, train.mbs, grad_acc) for step in range(steps)]
    peaks: list[int] = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        for micro_batches in batches:
            train_step(wrapped, micro_batches)
            torch.cuda.synchronize(device)
            peaks.append(torch.cuda.max_memory_allocated(device))
    else:
        tracker = load_trackers()[0]()
        tracker.track_external(wrapped.model, getattr(wrapped.optimizer, "optim", wrapped.optimizer))
        with tracker:
            for micro_batches in batches:
                train_step(wrapped, micro_batches)
                peaks.append(max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values()))
                tracker.reset_mod_stats()  # one forward per module per step (the overall peak survives)
    del wrapped
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return psi, peaks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--mbs", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="steps from the build on (the second rebuilds DDP's buckets)")
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    backend, store = ("nccl" if cuda else "gloo"), dist.HashStore()  # one rank: its store needs no port
    dist.init_process_group(backend, store=store, rank=0, world_size=1, device_id=device if cuda else None)
    instrument = "max_memory_allocated" if cuda else "torch's memory tracker"
    print(f"{a.model}, seq_len {a.seq_len}, mbs {a.mbs}, dp 1, on {device.type} ({instrument}), {a.steps} steps")
    print(f"{'precision':<9} {'AdamW':<13} {'stage':<6} peak after each step, in Ψ (4 bytes per parameter = 4.0)")
    optimizers = [("fused", True)] if cuda else [("single-tensor", False), ("fused", True)]
    try:
        for precision in ("fp32", "bf16"):
            for name, fused in optimizers:
                per_stage = {}
                for stage in (0, 1):
                    cfg = compose_config(
                        [
                            f"model={a.model}",
                            "parallel.dp=1",
                            f"parallel.zero_stage={stage}",
                            f"train.seq_len={a.seq_len}",
                            f"train.mbs={a.mbs}",
                            f"train.precision={precision}",
                            f"hardware={'h100' if cuda else 'cpu'}",
                        ]
                    )
                    psi, peaks = peaks_per_step(cfg, device, fused, a.steps)
                    per_stage[stage] = peaks
                    print(f"{precision:<9} {name:<13} ZeRO-{stage} " + "  ".join(f"{b / psi:7.3f}" for b in peaks))
                excess = [one - zero for zero, one in zip(per_stage[0], per_stage[1])]
                print(
                    f"{precision:<9} {name:<13} 1 − 0   "
                    + "  ".join(f"{e / psi:+7.3f}" for e in excess)
                    + "   in bytes: "
                    + ", ".join(f"{e:+,}" for e in excess)
                )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
