"""The sweep driver's own time per point: wall time of a sweep not spent inside torchrun.

Runs a named sweep (default: the demo grid) as a user would (`scaling sweep NAME`), then reads
every record's `timing.torchrun_wall_s`:

    driver time per point = (sweep wall time - sum of torchrun wall times - device waits) / points

A device wait (`timing.device_wait_s`: the point waited for the host's device lease, which another sweep on the
machine held) is not the driver's work either, and is printed apart.

It covers Hydra's composition of each point, validation, the memory prediction, the record write
and W&B logging, and, once, the driver's start-up (printed apart). Target: <= 0.5 s per point.
A second pass over the same directory times the resume path (every point answered from the store).
It also prints what the device time the launches held went to (scaling.store.device_time): the share in
timed steps, in warm-up, in start-up and teardown, and in launches that did not end ok.

    python benchmarks/bench_sweep.py [--sweep demo] [--dir DIR] [overrides ...]
    python benchmarks/bench_sweep.py --device-time DIR     the device time of a store already written
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scaling.store.device_time import total  # noqa: E402
from scaling.store.read import iter_records  # noqa: E402


def run_sweep(name: str, sweep_dir: Path, overrides: list[str]) -> float:
    """Wall seconds of `scaling sweep NAME sweep_dir=... overrides`."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "scaling", "sweep", name, f"sweep_dir={sweep_dir}", *overrides],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def startup_s() -> float:
    """Wall seconds of the driver doing nothing: `scaling run --help` (interpreter, Hydra, torch imports)."""
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "scaling", "run", "--help"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - t0


def device_time_line(records: list[dict]) -> str:
    """`device time 0.214 device-h held by 38 points: 8.1% in timed steps, ...` for a store's records."""
    return f"device time {total(r.get('timing') or {} for r in records).held()}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", default="demo")
    p.add_argument("--dir", type=Path, default=None, help="sweep directory (default: a new temporary one)")
    p.add_argument("--device-time", type=Path, metavar="DIR", help="only print the device time of the store DIR")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    if a.device_time is not None:
        print(f"bench_sweep: {a.device_time}: {device_time_line(list(iter_records(a.device_time)))}")
        return
    sweep_dir = (a.dir or Path(tempfile.mkdtemp(prefix="bench_sweep_")) / a.sweep).resolve()

    wall = run_sweep(a.sweep, sweep_dir, a.overrides)
    records = list(iter_records(sweep_dir))
    torchrun = sum(r["timing"].get("torchrun_wall_s") or 0.0 for r in records)
    launched = sum(1 for r in records if r["timing"].get("torchrun_wall_s"))
    waited = sum(r["timing"].get("device_wait_s") or 0.0 for r in records)
    start = startup_s()
    resume_wall = run_sweep(a.sweep, sweep_dir, a.overrides)
    n = len(records)
    per_point = (wall - torchrun - waited - start) / n
    statuses = {s: sum(r["status"] == s for r in records) for s in sorted({r["status"] for r in records})}
    print(
        f"bench_sweep: sweep {a.sweep} {' '.join(a.overrides)} -> {n} points {statuses}, {launched} launched; {sweep_dir}"
    )
    print(
        f"  sweep wall {wall:8.1f} s   in torchrun {torchrun:8.1f} s   waiting for a device {waited:6.1f} s   "
        f"driver start-up {start:5.2f} s"
    )
    print(f"  driver time per point {per_point:6.3f} s   (target <= 0.5)")
    print(f"  {device_time_line(records)}")
    print(
        f"  resume (all {n} points answered from the store): {resume_wall:6.1f} s, "
        f"{(resume_wall - start) / n:6.3f} s per point after start-up"
    )


if __name__ == "__main__":
    main()
