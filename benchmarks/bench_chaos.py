"""Two drivers on one sweep directory, one SIGKILLed at a seeded moment and started again, over several seeds.

    python benchmarks/bench_chaos.py [--seeds 0,1,2,3,4]

Each run is tests/helpers/chaos.py's: 12 tiny points at dp=2 on warm ranks, two `scaling run -m` drivers at once on
one host lease, one killed after a seeded number of records (0 to 10) and a seeded 0-1 s more, and started again.
Per seed it prints after how many records the kill was due, when it came, how many points were recorded then, how
many claims were taken over from the dead driver, how often a driver waited for a claim or for the lease, the
longest device wait of a point, the wall time and the launch directories the killed driver left (each launch writes
into its own; nothing removes another's); a run whose store is wrong (a point recorded twice or not at all, a
process left) stops with the reason.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.chaos import POINTS, chaos  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    a = p.parse_args()
    print(f"{POINTS} points, two drivers, one SIGKILLed and started again")
    print(
        "seed  victim  due after  killed at s  recorded then  took over  claim waits  lease waits  max device wait s"
        "  wall s  killed launch dirs"
    )
    for seed in (int(s) for s in a.seeds.split(",")):
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
    print(
        "every run: each point recorded once (attempt 1, one launch, one summary line), no process left, each record's"
        " launch directory holding its config and log (a killed launch's directory left beside, untouched)"
    )


if __name__ == "__main__":
    main()
