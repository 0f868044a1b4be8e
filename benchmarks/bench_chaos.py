"""Drivers on one sweep directory under faults: one SIGKILLed and started again, one stopped (SIGSTOP) beside a
second and continued, and a disk that fills up; over several seeds and disk sizes.

    python benchmarks/bench_chaos.py [--seeds 0,1,2,3,4] [--stop-seeds 0,1,2] [--disk-sizes 160k,200k,240k]

Each run is one of tests/helpers/chaos.py's, on 12 tiny points at dp=2 on warm ranks:

- kill: two `scaling run -m` drivers at once on one host lease, one killed after a seeded number of records (0 to
  10) and a seeded 0-1 s more, and started again. Per seed: after how many records the kill was due, when it came,
  how many points were recorded then, how many claims were taken over from the dead driver, how often a driver
  waited for a claim or for the lease, the longest device wait of a point, the wall time and the launch directories
  the killed driver left (each launch writes into its own; nothing removes another's).
- stop: one driver's process group stopped at such a moment (a suspended terminal), a second driver run to its end
  beside it (launch.stalled_wait_s=5), `scaling status` read, the first continued. Per seed: the point the stopped
  driver held (or -), how long it was stopped, the second driver's wall time, exit status and points recorded, and
  how much of the stop fell in a launch (recorded as stopped_s, in no device time).
- disk: the grid on a tmpfs of each size (needs root) until the disk is full, then the same command with space.
  Per size: points recorded when it stopped, the path its one-line stop names (relative to the store) and the space
  it says is left, the first run's wall time and both runs'.

A run whose store is wrong (a point recorded twice or not at all, a measurement no record holds, a process left, a
traceback, a file written in part) stops with the reason.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.chaos import POINTS, chaos, disk_full, stop_and_continue  # noqa: E402
from tests.helpers.mounts import ROOT_ONLY  # noqa: E402


def _kills(seeds: list[int]) -> None:
    print(f"kill: {POINTS} points, two drivers, one SIGKILLed and started again")
    print(
        "seed  victim  due after  killed at s  recorded then  took over  claim waits  lease waits  max device wait s"
        "  wall s  killed launch dirs"
    )
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="scaling-chaos-") as tmp:
            f = chaos(Path(tmp) / "runs", seed)
        print(
            f"{f['seed']:>4}  {f['victim']:>6}  {f['kill_after_records']:>9}  "
            f"{f['killed_after_s']:>11}{'' if f['killed'] else ' (ended)'}  "
            f"{f['recorded_at_kill']:>13}  {f['took_over']:>9}  {f['waited_for_a_claim']:>11}  "
            f"{f['lease_waits_said']:>11}  {f['max_device_wait_s']:>17}  {f['wall_s']:>6}  "
            f"{f['launch_dirs_left_by_the_killed']:>18}",
            flush=True,
        )


def _stops(seeds: list[int]) -> None:
    print(f"stop: {POINTS} points, one driver stopped (SIGSTOP), a second run to its end beside it, then SIGCONT")
    print(
        "seed  due after  recorded then  held point    stopped s  2nd wall s  2nd exit  2nd recorded"
        "  in a launch s  its device s  wall s"
    )
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="scaling-stop-") as tmp:
            f = stop_and_continue(Path(tmp) / "runs", seed)
        print(
            f"{f['seed']:>4}  {f['stop_after_records']:>9}  {f['recorded_at_stop']:>13}  {f['held']:<12}  "
            f"{f['stopped_s']:>9}  {f['b_wall_s']:>10}  {f['b_exit']:>8}  {f['recorded_by_b']:>12}  "
            f"{f['launch_stopped_s']:>13}  {f['device_s_of_it']:>12}  {f['wall_s']:>6}",
            flush=True,
        )


def _disks(sizes: list[str]) -> None:
    if ROOT_ONLY:
        print(f"disk: skipped, {ROOT_ONLY}")
        return
    print(f"disk: {POINTS} points on a tmpfs until it is full, then again with 64 MiB")
    print("size   recorded then  stopped writing                        KiB free  1st run s  wall s")
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="scaling-disk-") as tmp:
            f = disk_full(Path(tmp), size)
        print(
            f"{f['size']:<5}  {f['recorded_at_stop']:>13}  {f['stopped_writing']:<37}  {str(f['free_kib']):>8}  "
            f"{f['first_s']:>9}  {f['wall_s']:>6}",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3,4", help="kill runs ('' for none)")
    p.add_argument("--stop-seeds", default="0,1,2", help="stop and continue runs ('' for none)")
    p.add_argument("--disk-sizes", default="160k,200k,240k", help="tmpfs sizes of the disk-full runs ('' for none)")
    a = p.parse_args()
    ints = [int(s) for s in a.seeds.split(",") if s]
    if ints:
        _kills(ints)
    stops = [int(s) for s in a.stop_seeds.split(",") if s]
    if stops:
        _stops(stops)
    sizes = [s for s in a.disk_sizes.split(",") if s]
    if sizes:
        _disks(sizes)
    print(
        "every run: each point recorded once (attempt 1, one launch, one summary line), no process left, each record's"
        " launch directory holding its config and log (a killed launch's directory left beside, untouched); stop and"
        " disk runs: every measurement a record's, no traceback, every file whole"
    )


if __name__ == "__main__":
    main()
