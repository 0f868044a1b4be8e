"""Ranks forked from their torchrun agent against fresh interpreters, side by side in one run (scaling/engine/agent.py).

The same fresh launches (launch.reuse=false: a driver, torchrun's agent and its ranks) run `--rounds` times with
SCALING_FORK_RANKS=1 (the CPU default: the agent imports torch, its compiler stack and the worker once, then forks
the ranks) and =0 (each rank a fresh interpreter that imports them, as on CUDA), alternating so both see the same
machine. Per point it prints the CPU seconds of the whole launch (driver, agent and ranks: the children's rusage)
and its wall, median [min-max] over the rounds, their ratios, and whether both measured the same losses.

    python benchmarks/bench_fork.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["logger=none", "model=tiny", "train.seq_len=64", "train.mbs=2", "launch.reuse=false", "launch.repeats=1"]
POINTS = {
    "dp2 zero0": ["parallel.dp=2", "parallel.zero_stage=0"],
    "dp2 zero3": ["parallel.dp=2", "parallel.zero_stage=3"],
    "dp4 zero0": ["parallel.dp=4", "parallel.zero_stage=0", "hardware.oversubscribe=true"],
}


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch(overrides: list[str], sweep_dir: Path, fork: str) -> tuple[float, float, list[float]]:
    """(CPU s, wall s, losses) of one `scaling run` of the point in a fresh directory."""
    env = {**os.environ, "SCALING_FORK_RANKS": fork}
    cpu, wall = children_cpu_s(), time.perf_counter()
    argv = [sys.executable, "-m", "scaling", "run", *COMMON, *overrides, f"sweep_dir={sweep_dir}"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    cpu, wall = children_cpu_s() - cpu, time.perf_counter() - wall
    (result,) = sweep_dir.glob("*/result.json")
    record = json.loads(result.read_text())
    if done.returncode != 0 or record["status"] != "ok":
        raise SystemExit(f"{overrides} SCALING_FORK_RANKS={fork}: {record['status']} {record.get('error')}")
    return cpu, wall, record["metrics"]["losses"]


def band(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f} [{min(values):5.2f}-{max(values):5.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs: dict[tuple[str, str], list[tuple[float, float, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, overrides in POINTS.items():
                for fork in ("1", "0") if r % 2 == 0 else ("0", "1"):
                    sweep_dir = Path(tmp) / f"{name.replace(' ', '_')}-{fork}-{r}"
                    runs.setdefault((name, fork), []).append(launch(overrides, sweep_dir, fork))
    print(f"bench_fork: {args.rounds} rounds, forked and fresh ranks alternating; {' '.join(COMMON)}")
    print("  point       CPU s forked (median [min-max])  fresh               forked/fresh  wall s forked"
          "        fresh               forked/fresh  losses equal")  # fmt: skip
    for name in POINTS:
        forked, fresh = runs[(name, "1")], runs[(name, "0")]
        cpu = [c for c, _, _ in forked], [c for c, _, _ in fresh]
        wall = [w for _, w, _ in forked], [w for _, w, _ in fresh]
        same = all(losses == fresh[0][2] for _, _, losses in forked + fresh)
        print(
            f"  {name:10s}  {band(cpu[0])}                {band(cpu[1])}  "
            f"{statistics.median(cpu[0]) / statistics.median(cpu[1]):12.2f}  {band(wall[0])}  {band(wall[1])}  "
            f"{statistics.median(wall[0]) / statistics.median(wall[1]):12.2f}  {same}"
        )


if __name__ == "__main__":
    main()
