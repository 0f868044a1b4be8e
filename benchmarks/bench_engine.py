"""Engine overheads, measured side by side in one run (ratios, not absolute times).

1. Throughput: tokens/s per rank of `scaling.engine.worker` vs a bare hand-written DDP loop on the same
   model and batch shape (target ratio >= 0.97).
2. Launch overhead: a job's wall time minus its measured window vs the wall time of a bare
   `torchrun` of a script that only imports torch and joins a gloo group (target <= 1.5x).
Runs alternate A/B so that drift in the machine's load hits both.

    python benchmarks/bench_engine.py [--reps 3] [--model small] [--seq 128] [--mbs 8] [--dp 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from scaling.core.host import usable_cores  # noqa: E402
from scaling.job.run import run_point  # noqa: E402
from tests.helpers.compose import compose_point  # noqa: E402


def torchrun(script: str, nproc: int, *args: str, threads: int) -> float:
    """Wall seconds of `torchrun --standalone --nproc-per-node=nproc script args`."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script, *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--model", default="small")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mbs", type=int, default=8)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="hardware.threads_per_device: pinned threads per rank")
    a = p.parse_args()
    threads = a.threads
    work = Path(tempfile.mkdtemp(prefix="bench_engine_"))
    overrides = [
        f"model={a.model}",
        f"train.seq_len={a.seq}",
        f"train.mbs={a.mbs}",
        "train.grad_acc=1",
        f"parallel.dp={a.dp}",
        "parallel.zero_stage=0",
        f"train.steps={a.steps}",
        "train.warmup_steps=2",
        "logger=none",
        "launch.rerun=all",
        f"hardware.threads_per_device={threads}",
    ]
    cfg = compose_point(overrides, work / "runs")
    model_json = json.dumps(dataclasses.asdict(cfg.model))
    tokens_per_step = a.mbs * a.seq

    ours, bare, overhead, bare_wall = [], [], [], []
    for rep in range(a.reps):
        rec = run_point(cfg)
        assert rec["status"] == "ok", rec["error"]
        ours.append(rec["metrics"]["tokens_per_s_per_gpu"])
        overhead.append(rec["timing"]["launch_overhead_s"])
        out = work / f"bare{rep}.json"
        torchrun(
            str(HERE / "bare_ddp.py"),
            a.dp,
            str(out),
            model_json,
            str(a.seq),
            str(a.mbs),
            str(a.steps),
            "2",
            str(threads),
            threads=threads,
        )
        bare.append(tokens_per_step / json.loads(out.read_text())["step_time_s"])
        bare_wall.append(torchrun(str(HERE / "bare_join.py"), a.dp, threads=threads))

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    print(
        f"bench_engine: model={a.model} seq={a.seq} mbs={a.mbs} dp={a.dp} ZeRO-0 fp32, {a.steps} timed steps, "
        f"{threads} pinned threads/rank, {a.reps} reps, host {os.uname().nodename} ({usable_cores()} cores)"
    )
    print(
        f"  tokens/s per rank   scaling.engine.worker {med(ours):10.1f}   bare DDP loop {med(bare):10.1f}   "
        f"ratio {med(ours) / med(bare):.3f}  (target >= 0.97)  runs: {[round(x) for x in ours]} vs {[round(x) for x in bare]}"
    )
    print(
        f"  launch overhead s   scaling job    {med(overhead):10.2f}   bare torchrun {med(bare_wall):10.2f}   "
        f"ratio {med(overhead) / med(bare_wall):.2f}   (target <= 1.5)"
    )


if __name__ == "__main__":
    main()
