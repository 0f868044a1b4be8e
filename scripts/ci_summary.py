"""CI's last lines: its own wall time, each lane's test count, time and start (after how much set-up), and the slowest
tests of both lanes, read from the JUnit XML files pytest wrote (`--junitxml`), so that a slowdown is seen the day it
lands, in the set-up as in the tests.

Usage: python scripts/ci_summary.py START_EPOCH_SECONDS LANE=FILE.xml [LANE=FILE.xml ...]
"""

from __future__ import annotations

import sys
import time
import xml.etree.ElementTree as ET
from datetime import datetime

SLOWEST = 10


def minutes(seconds: float) -> str:
    """`seconds` as whole minutes and the seconds left, rounded to the second (570.6 s: 9 min 31 s)."""
    whole_minutes, rest = divmod(round(seconds), 60)
    return f"{whole_minutes} min {rest} s"


def main(argv: list[str]) -> int:
    started, lanes = float(argv[0]), [a.split("=", 1) for a in argv[1:]]
    cases: list[tuple[float, str, str]] = []
    lines = []
    for lane, path in lanes:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            lines.append(f"  {lane}: no JUnit report ({e})")
            continue
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        count = sum(int(s.get("tests", 0)) for s in suites)
        wall = sum(float(s.get("time", 0.0)) for s in suites)
        stamps = [datetime.fromisoformat(s.get("timestamp", "")).timestamp() for s in suites if s.get("timestamp")]
        start = f", started {round(min(stamps) - started)} s into the run" if stamps else ""
        lines.append(f"  {lane}: {count} tests, pytest's wall {minutes(wall)}{start}")
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            cases.append((float(case.get("time", 0.0)), lane, name))
    elapsed = time.time() - started
    print(f"\nCI wall time: {minutes(elapsed)} (set-up included)")
    print("\n".join(lines))
    print(f"The {SLOWEST} slowest tests (each test's own time, set-up and teardown included):")
    for seconds, lane, name in sorted(cases, reverse=True)[:SLOWEST]:
        print(f"  {seconds:6.1f} s  {lane:<6}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
