"""Agents forked from the driver's agent server against fresh agent interpreters, side by side in one run
(scaling/launch/agents.py).

One driver (`scaling run`) launches the same point `--launches` times as fresh launches (launch.repeats, no warm
ranks), with the driver's agent server (the CPU default) and without it (SCALING_AGENT_SERVER=0: each agent a fresh
interpreter that imports torch and the ranks' modules), alternating `--rounds` times so both see the same machine.
It prints the CPU seconds of the whole driver (itself, its server, agents and ranks: the children's rusage) and its
wall, median [min-max] over the rounds, the CPU per launch, their ratios, and whether both measured the same losses.

    python benchmarks/bench_agents.py [--rounds 3] [--launches 4]
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
POINT = ["logger=none", "model=tiny", "train.seq_len=64", "train.mbs=2", "parallel.dp=2", "launch.reuse=false"]


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def drive(sweep_dir: Path, launches: int, server: bool) -> tuple[float, float, list[list[float]]]:
    """(CPU s, wall s, each launch's losses) of one `scaling run` of the point `launches` times."""
    env = {**os.environ, "SCALING_AGENT_SERVER": "" if server else "0"}
    cpu, wall = children_cpu_s(), time.perf_counter()
    argv = [sys.executable, "-m", "scaling", "run", *POINT, f"launch.repeats={launches}", f"sweep_dir={sweep_dir}"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    cpu, wall = children_cpu_s() - cpu, time.perf_counter() - wall
    (result,) = sweep_dir.glob("*/result.json")
    record = json.loads(result.read_text())
    if done.returncode != 0 or record["status"] != "ok" or len(record["repeats"]) != launches:
        raise SystemExit(f"server={server}: {record['status']} {record.get('error')}\n{done.stderr[-2000:]}")
    return cpu, wall, [r["metrics"]["losses"] for r in record["repeats"]]


def band(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} [{min(values):6.2f}-{max(values):6.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--launches", type=int, default=4)
    args = parser.parse_args()
    runs: dict[bool, list[tuple[float, float, list[list[float]]]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for server in (True, False) if r % 2 == 0 else (False, True):
                runs[server].append(drive(Path(tmp) / f"{server}-{r}", args.launches, server))
    n = args.launches
    print(f"bench_agents: {args.rounds} rounds alternating, one driver of {n} fresh launches each; {' '.join(POINT)}")
    served, fresh = runs[True], runs[False]
    cpu = [c for c, _, _ in served], [c for c, _, _ in fresh]
    wall = [w for _, w, _ in served], [w for _, w, _ in fresh]
    first = fresh[0][2][0]
    same = all(losses == first for _, _, each in served + fresh for losses in each)
    print(f"  CPU s per driver   served {band(cpu[0])}  fresh {band(cpu[1])}  served/fresh "
          f"{statistics.median(cpu[0]) / statistics.median(cpu[1]):.2f}")  # fmt: skip
    print(f"  CPU s per launch   served {statistics.median(cpu[0]) / n:6.2f}  fresh {statistics.median(cpu[1]) / n:6.2f}"
          f"  saved {(statistics.median(cpu[1]) - statistics.median(cpu[0])) / n:.2f} s a launch")  # fmt: skip
    print(f"  wall s per driver  served {band(wall[0])}  fresh {band(wall[1])}  served/fresh "
          f"{statistics.median(wall[0]) / statistics.median(wall[1]):.2f}")  # fmt: skip
    print(f"  losses equal: {same}")


if __name__ == "__main__":
    main()
