"""Two real drivers on one sweep directory, one of them SIGKILLed at a seeded moment and started again.

`chaos(sweep_dir, seed)` runs the grid below (12 tiny points at dp=2 on warm ranks) as two `scaling run -m`
processes at once, sharing the host's device lease (a lock directory of the run's own), kills one of them at a
moment drawn from `seed` (a number of records, then a fraction of a second), starts it again, waits for all three,
and checks what a shared store must hold:

- every point recorded exactly once: one `result.json` per point, all `ok`, attempt 1, one launch each, and one
  summary line per point across the drivers' outputs (a point run twice prints two, even where the second write
  would look the same);
- no process left: none that carries the run's lock directory in its environment (drivers, torchrun, ranks).

It returns the figures the test and `benchmarks/bench_chaos.py` print.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from scaling.launch.devices import LOCK_DIR_ENV
from scaling.store.read import iter_records
from tests.helpers.compose import REPO

GRID = [
    "logger=none",
    "model=tiny",
    "train.mbs=1",
    "train.warmup_steps=0",
    "train.steps=1",
    "parallel.dp=2",
    "launch.reuse=true",
    "launch.reuse_idle_s=30",
    "launch.timeout_s=120",
    "parallel.zero_stage=0,1,2,3",
    "train.seq_len=16,24,32",
]
POINTS = 12
SUMMARY = re.compile(r"^\[scaling\] ([0-9a-f]{12}) (ok|oom|failed|timeout|invalid|predicted_oom)\b", re.M)


def _driver(sweep_dir: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "scaling", "run", "-m", *GRID, f"sweep_dir={sweep_dir}"]
    with open(log, "w") as out:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _ours(lock_dir: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(LOCK_DIR_ENV) == lock_dir:
                found.append(p)
        except psutil.Error:
            continue
    return found


def chaos(sweep_dir: Path, seed: int, late_s: float = 1.0) -> dict[str, Any]:
    """One run (see the module's docstring); raises AssertionError naming what the store got wrong.

    The kill's moment is drawn as progress, not as a time, so that it falls inside the grid on a fast machine as on
    a slow one: after a seeded number of records (0 to POINTS - 2: before the first point, between points, never
    after the last), a seeded 0 to `late_s` seconds later (at the record's write, in the next point's claim, lease
    or launch, or in its steps)."""
    rng = random.Random(seed)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock_dir = str(sweep_dir.parent / f"{sweep_dir.name}-locks")
    env = {**os.environ, LOCK_DIR_ENV: lock_dir}
    logs = [sweep_dir.parent / f"{sweep_dir.name}-driver{i}.log" for i in range(3)]
    start = time.monotonic()
    drivers = [_driver(sweep_dir, env, logs[0]), _driver(sweep_dir, env, logs[1])]
    after_records, late = rng.randrange(POINTS - 1), rng.uniform(0.0, late_s)
    victim = rng.randrange(2)
    deadline = start + 300.0
    while drivers[victim].poll() is None and time.monotonic() < deadline:
        if len(list(sweep_dir.glob("*/result.json"))) >= after_records:
            time.sleep(late)
            break
        time.sleep(0.05)
    kill_after = time.monotonic() - start
    recorded_at_kill = len(list(sweep_dir.glob("*/result.json")))
    killed = drivers[victim].poll() is None
    if killed:
        drivers[victim].kill()
        drivers[victim].wait()
    drivers.append(_driver(sweep_dir, env, logs[2]))  # started again
    for d in drivers:
        d.wait(timeout=600)
    wall_s = time.monotonic() - start
    outputs = [log.read_text() for log in logs]

    left = _ours(lock_dir)
    for p in left:
        p.kill()
    assert not left, f"processes left: {[' '.join(p.cmdline()[:6]) for p in left]}"
    codes = [d.returncode for i, d in enumerate(drivers) if not (killed and i == victim)]
    assert set(codes) == {0}, (codes, [o[-2000:] for o in outputs])
    records = list(iter_records(sweep_dir))
    assert len(records) == POINTS, f"{len(records)} records for {POINTS} points"
    assert all(r["status"] == "ok" for r in records), [(r["job_key"], r["status"], r["error"]) for r in records]
    attempts = sorted({r["provenance"]["attempt"] for r in records})
    assert attempts == [1], f"attempts {attempts}: a point was recorded more than once"
    assert all(len(r["repeats"]) == 1 for r in records), "a record holds more than one launch"
    summaries = [key for out in outputs for key, _ in SUMMARY.findall(out)]
    twice = sorted({k for k in summaries if summaries.count(k) > 1})
    assert not twice, f"points recorded more than once: {twice}"
    assert sorted(summaries) == sorted(r["job_key"] for r in records)
    # Each launch wrote into a directory of its own, which its record names; a killed driver's stays beside it.
    named = [sweep_dir / r["job_key"] / r["repeats"][0]["dir"] for r in records]
    assert all((d / "torchrun.log").is_file() and (d / "config.json").is_file() for d in named), named
    launch_dirs = sorted(sweep_dir.glob("*/launches/*"))
    assert set(named) <= set(launch_dirs), "a record names a directory no launch made"
    return {
        "seed": seed,
        "victim": victim,
        "kill_after_records": after_records,
        "killed_after_s": round(kill_after, 1),
        "killed": killed,
        "recorded_at_kill": recorded_at_kill,
        "took_over": sum(r["provenance"].get("took_over") is not None for r in records),
        "waited_for_a_claim": sum(out.count("waiting for its record") for out in outputs),
        "lease_waits_said": sum(out.count("waiting for cpu slots") + out.count("waiting in line") for out in outputs),
        "launch_dirs_left_by_the_killed": len(launch_dirs) - len(named),
        "max_device_wait_s": round(max(r["repeats"][0]["timing"]["device_wait_s"] or 0.0 for r in records), 1),
        "wall_s": round(wall_s, 1),
    }
