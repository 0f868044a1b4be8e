"""Activation recomputation on CPU: none, selective and full measured beside both memory predictors and the step
model's compute.

    python benchmarks/bench_recompute_cpu.py [--repeats 3]

One rank (one pinned thread) stands for one GPU. A 4-block built-in decoder (hidden 256, seq 256, mbs 4: its
activations a large part of its peak) runs each `train.recompute` setting at three layouts: dp=1 ZeRO-0 fp32,
dp=2 ZeRO-3 fp32 and dp=2 ZeRO-3 bf16. Memory: the peak of live tensor bytes the tracker measured on a rank, beside
the analytic and the traced predictions (targets: analytic within 3%, traced within 1%). Step time: the three
settings' launches alternate `--repeats` times, so a loaded machine slows each alike; each setting's median step
time over none's, per repeat, beside the step model's charge (its hardware FLOPs over none's: 1 for selective, which
runs no matmul twice; full's forward again). Prints Markdown; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from scaling.job.run import run_point
from scaling.predictor.analytic import predict_config
from scaling.predictor.trace import trace_peak
from scaling.sweep.compose import compose_config

MODEL = ["model=small", "model.hidden=256", "model.ffn_hidden=768", "model.n_layers=4"]
POINT = [
    *MODEL,
    "logger=none",
    "train.seq_len=256",
    "train.mbs=4",
    "train.warmup_steps=2",
    "train.steps=4",
    "hardware.threads_per_device=1",
    "launch.timeout_s=600",
]
LAYOUTS = {
    "dp=1 ZeRO-0 fp32": ["parallel.dp=1", "parallel.zero_stage=0", "train.precision=fp32"],
    "dp=2 ZeRO-3 fp32": ["parallel.dp=2", "parallel.zero_stage=3", "train.precision=fp32"],
    "dp=2 ZeRO-3 bf16": ["parallel.dp=2", "parallel.zero_stage=3", "train.precision=bf16"],
}
SETTINGS = ("none", "selective", "full")


def _err(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.2%}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="launches of each setting per layout, alternating")
    a = p.parse_args()
    mib = 2**20
    memory, times = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, layout in LAYOUTS.items():
            for r in range(a.repeats):
                for rc in SETTINGS:
                    cfg = compose_config([*POINT, *layout, f"train.recompute={rc}", f"sweep_dir={Path(tmp) / str(r)}"])
                    rec = run_point(cfg)
                    if rec["status"] != "ok":
                        raise SystemExit(f"{name} {rc}: {rec['status']}: {rec['error']}")
                    times.setdefault((name, rc), []).append(rec["metrics"]["step_time_s"])
                    if r == 0:
                        measured = rec["metrics"]["peak_mem_bytes"]
                        analytic = predict_config(cfg).total_bytes
                        traced = trace_peak(cfg).peak_mem_bytes
                        flops = rec["derived"]["hw_flops_per_token"]
                        memory.append((name, rc, measured, analytic, traced, flops, rec["derived"]["flops_per_token"]))
    print("| layout | recompute | measured MiB | analytic MiB | error | traced MiB | error |")
    print("|---|---|---|---|---|---|---|")
    for name, rc, measured, analytic, traced, _, _ in memory:
        print(
            f"| {name} | {rc} | {measured / mib:.2f} | {analytic / mib:.2f} | {_err(analytic, measured)} | "
            f"{traced / mib:.2f} | {_err(traced, measured)} |"
        )
    print()
    print(f"Step time over none's, {a.repeats} alternating launches each (median [min, max] of the per-repeat ratio):")
    print()
    print("| layout | recompute | median step s | measured / none | predicted / none (HFU FLOPs) | HFU / MFU |")
    print("|---|---|---|---|---|---|")
    hfu = {(n, rc): (f, m) for n, rc, _, _, _, f, m in memory}
    for name in LAYOUTS:
        base = times[name, "none"]
        for rc in SETTINGS:
            ratios = [t / b for t, b in zip(times[name, rc], base)]
            flops, model = hfu[name, rc]
            print(
                f"| {name} | {rc} | {statistics.median(times[name, rc]):.3f} | {statistics.median(ratios):.3f} "
                f"[{min(ratios):.3f}, {max(ratios):.3f}] | {flops / hfu[name, 'none'][0]:.3f} | {flops / model:.3f} |"
            )


if __name__ == "__main__":
    main()
