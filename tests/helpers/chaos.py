"""Real drivers on one sweep directory under faults, on the grid below (12 tiny points at dp=2 on warm ranks) or
another one given (`SMALL_GRID`: the suite's).

`chaos(sweep_dir, seed)` runs it as two `scaling run -m` processes at once, sharing the host's device lease (a lock
directory of the run's own), kills one of them at a moment drawn from `seed` (a number of records, then a fraction
of a second), starts it again, waits for all three. `stop_and_continue(sweep_dir, seed)` stops one driver's process
group (SIGSTOP) at such a moment, runs a second driver to its end beside it, reads `scaling status`, then continues
the first (SIGCONT). `disk_full(root, size)` runs it on a tmpfs of that size until the disk is full, then again with
space. Each checks what a shared store must hold:

- every point recorded exactly once: one `result.json` per point, all `ok`, attempt 1, one launch each, and one
  summary line per point across the drivers' outputs (a point run twice prints two, even where the second write
  would look the same);
- no process left: none that carries the run's lock directory in its environment (drivers, torchrun, ranks);

and returns the figures the tests and `benchmarks/bench_chaos.py` print.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import psutil

from scaling.launch.devices import LOCK_DIR_ENV
from scaling.store import inflight
from scaling.store.read import iter_records
from tests.helpers.compose import REPO
from tests.helpers.mounts import resize, tmpfs

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


def points_of(grid: Sequence[str]) -> int:
    """How many points a grid of comma-separated overrides has."""
    return math.prod(len(o.split("=", 1)[1].split(",")) for o in grid)


POINTS = points_of(GRID)
SMALL_GRID = [
    *(o for o in GRID if not o.startswith(("parallel.dp=", "parallel.zero_stage=", "train.seq_len="))),
    "parallel.dp=1",
    "parallel.zero_stage=0,1,2",
    "train.seq_len=16,24",
]
"""6 points like GRID's at dp=1, for the suite: the same drivers, warm jobs, lease and store, half the turns and one
rank a job instead of two (what is tested is the store and the processes around the ranks, not the collectives)."""
SUMMARY = re.compile(r"^\[scaling\] ([0-9a-f]{12}) (ok|oom|failed|timeout|invalid|predicted_oom)\b", re.M)


def _driver(
    sweep_dir: Path, env: dict[str, str], log: Path, *extra: str, session: bool = False, grid: Sequence[str] = GRID
) -> subprocess.Popen:
    argv = [sys.executable, "-m", "scaling", "run", "-m", *grid, f"sweep_dir={sweep_dir}", *extra]
    with open(log, "w") as out:
        return subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=session,  # a process group of its own, as a shell's job is
        )


def _ours(lock_dir: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(LOCK_DIR_ENV) == lock_dir:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _at_progress(
    sweep_dir: Path, driver: subprocess.Popen, rng: random.Random, late_s: float, points: int = POINTS
) -> int:
    """Wait for a moment drawn as progress, not as a time, so that it falls inside the grid on a fast machine as on a
    slow one: after a seeded number of records (0 to `points` - 2: before the first point, between points, never after
    the last), a seeded 0 to `late_s` seconds later (at the record's write, in the next point's claim, lease or
    launch, or in its steps). The number of records it waited for."""
    after_records, late = rng.randrange(points - 1), rng.uniform(0.0, late_s)
    deadline = time.monotonic() + 300.0
    while driver.poll() is None and time.monotonic() < deadline:
        if len(list(sweep_dir.glob("*/result.json"))) >= after_records:
            time.sleep(late)
            break
        time.sleep(0.05)
    return after_records


def _check(
    sweep_dir: Path, lock_dir: str, outputs: list[str], kept_all: bool = True, points: int = POINTS
) -> list[dict[str, Any]]:
    """What a shared store must hold after the drivers have ended (the module's docstring), and with `kept_all`
    every measurement made kept in a record (a SIGKILLed driver loses the one it had not recorded); its records."""
    left = _ours(lock_dir)
    for p in left:
        p.kill()
    assert not left, f"processes left: {[' '.join(p.cmdline()[:6]) for p in left]}"
    records = list(iter_records(sweep_dir))
    assert len(records) == points, f"{len(records)} records for {points} points"
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
    assert set(named) <= set(sweep_dir.glob("*/launches/*")), "a record names a directory no launch made"
    measured = {p.parent for p in sweep_dir.glob("*/launches/*/worker.json")}
    assert not kept_all or measured <= set(named), f"measurements no record holds: {sorted(measured - set(named))}"
    return records


def _setting(sweep_dir: Path, drivers: int) -> tuple[str, dict[str, str], list[Path]]:
    """A run's lock directory, the drivers' environment that names it, and their logs."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock_dir = str(sweep_dir.parent / f"{sweep_dir.name}-locks")
    logs = [sweep_dir.parent / f"{sweep_dir.name}-driver{i}.log" for i in range(drivers)]
    return lock_dir, {**os.environ, LOCK_DIR_ENV: lock_dir}, logs


def chaos(sweep_dir: Path, seed: int, late_s: float = 1.0, grid: Sequence[str] = GRID) -> dict[str, Any]:
    """One run (see the module's docstring) of `grid` killing a driver at a seeded moment (`_at_progress`); raises
    AssertionError naming what the store got wrong."""
    rng, points = random.Random(seed), points_of(grid)
    lock_dir, env, logs = _setting(sweep_dir, 3)
    start = time.monotonic()
    drivers = [_driver(sweep_dir, env, logs[0], grid=grid), _driver(sweep_dir, env, logs[1], grid=grid)]
    victim = rng.randrange(2)
    after_records = _at_progress(sweep_dir, drivers[victim], rng, late_s, points)
    kill_after = time.monotonic() - start
    recorded_at_kill = len(list(sweep_dir.glob("*/result.json")))
    killed = drivers[victim].poll() is None
    if killed:
        drivers[victim].kill()
        drivers[victim].wait()
    drivers.append(_driver(sweep_dir, env, logs[2], grid=grid))  # started again
    for d in drivers:
        d.wait(timeout=600)
    wall_s = time.monotonic() - start
    outputs = [log.read_text() for log in logs]
    codes = [d.returncode for i, d in enumerate(drivers) if not (killed and i == victim)]
    assert set(codes) == {0}, (codes, [o[-2000:] for o in outputs])
    records = _check(sweep_dir, lock_dir, outputs, kept_all=False, points=points)
    launch_dirs = sorted(sweep_dir.glob("*/launches/*"))
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
        "launch_dirs_left_by_the_killed": len(launch_dirs) - len(records),
        "max_device_wait_s": round(max(r["repeats"][0]["timing"]["device_wait_s"] or 0.0 for r in records), 1),
        "wall_s": round(wall_s, 1),
    }


def stop_and_continue(sweep_dir: Path, seed: int, stalled_wait_s: float = 5.0, late_s: float = 1.0) -> dict[str, Any]:
    """Driver A's process group stopped (SIGSTOP) at a seeded moment (`_at_progress`); driver B runs the grid beside
    it with launch.stalled_wait_s and ends by itself, 1 and naming A's point if A held one, else 0; `scaling status`
    then says that point stalled; A continued (SIGCONT) ends 0. Raises AssertionError naming what went wrong."""
    rng = random.Random(seed)
    lock_dir, env, logs = _setting(sweep_dir, 2)
    start = time.monotonic()
    a = _driver(sweep_dir, env, logs[0], session=True)
    after_records = _at_progress(sweep_dir, a, rng, late_s)
    os.killpg(a.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        held = [key for key, m in inflight.read_markers(sweep_dir).items() if m.get("pid") == a.pid]
        recorded_at_stop = len(list(sweep_dir.glob("*/result.json")))
        b = _driver(sweep_dir, env, logs[1], f"launch.stalled_wait_s={stalled_wait_s:g}")
        b.wait(timeout=600)
        b_wall_s = time.monotonic() - stopped_at
        status = subprocess.run(
            [sys.executable, "-m", "scaling", "status", str(sweep_dir)], capture_output=True, text=True, timeout=120
        ).stdout
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    continued_at = time.monotonic()
    a.wait(timeout=600)
    wall_s = time.monotonic() - start
    outputs = [log.read_text() for log in logs]
    assert a.returncode == 0 and b.returncode == (1 if held else 0), (a.returncode, b.returncode, outputs[1][-2000:])
    for key in held:
        assert f"not run {key}: held by pid {a.pid} on" in outputs[1] and "stalled (stopped" in outputs[1]
        assert f"  stalled      1  {key}: pid {a.pid} on " in status, status
    records = _check(sweep_dir, lock_dir, outputs)
    by_b = len(SUMMARY.findall(outputs[1]))
    stopped = [r["repeats"][0]["timing"] for r in records if r["repeats"][0]["timing"].get("stopped_s")]
    return {
        "seed": seed,
        "stop_after_records": after_records,
        "recorded_at_stop": recorded_at_stop,
        "held": held[0] if held else "-",
        "stopped_s": round(continued_at - stopped_at, 1),
        "b_wall_s": round(b_wall_s, 1),
        "b_exit": b.returncode,
        "recorded_by_b": by_b,
        "launch_stopped_s": round(sum(t["stopped_s"] for t in stopped), 1),
        "device_s_of_it": round(sum(t["device_s"] for t in stopped), 1),
        "wall_s": round(wall_s, 1),
    }


def disk_full(root: Path, size: str, space: str = "64m") -> dict[str, Any]:
    """The grid on a tmpfs of `size` (needs root) until the disk is full, then the same command once the tmpfs has
    `space`: the first run stops in one line naming a path and the space left, no traceback, every file it wrote
    whole; the second records every point once. Raises AssertionError naming what went wrong."""
    with tmpfs(root / "disk", size) as disk:
        sweep_dir = disk / "runs"
        lock_dir, env, logs = _setting(sweep_dir, 2)
        start = time.monotonic()
        first = _driver(sweep_dir, env, logs[0])
        first.wait(timeout=600)
        first_s = time.monotonic() - start
        out = logs[0].read_text()
        recorded_at_stop = len(list(iter_records(sweep_dir)))
        stop = out.strip().splitlines()[-1]
        assert "Traceback" not in out, out[-3000:]
        broken = [p for p in sweep_dir.rglob("*.json") if not _whole_json(p)]
        assert not broken, f"files written in part: {broken}"
        if recorded_at_stop < POINTS:
            assert first.returncode == 1 and stop.startswith(f"scaling run: no space left writing {disk}/"), stop
        resize(disk, space)
        second = _driver(sweep_dir, env, logs[1])
        second.wait(timeout=600)
        outputs = [log.read_text() for log in logs]
        assert second.returncode == 0, outputs[1][-3000:]
        _check(sweep_dir, lock_dir, outputs)
        stopped_at = re.search(r"writing (\S+) \((\d+) KiB free", stop)
    return {
        "size": size,
        "recorded_at_stop": recorded_at_stop,
        "stopped_writing": str(Path(stopped_at.group(1)).relative_to(sweep_dir)) if stopped_at else "-",
        "free_kib": int(stopped_at.group(2)) if stopped_at else None,
        "first_s": round(first_s, 1),
        "wall_s": round(time.monotonic() - start, 1),
    }


def _whole_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True
