"""A store a team shares, under faults: two real drivers run one grid at once on warm ranks, one is SIGKILLed at a
seeded moment and started again; every point is recorded exactly once and no process is left
(tests/helpers/chaos.py, on 6 points like its grid's at dp=1; `python benchmarks/bench_chaos.py` runs more seeds on
all 12 at dp=2)."""

from __future__ import annotations

import pytest

from tests.helpers.chaos import SMALL_GRID, chaos

pytestmark = [pytest.mark.torchrun, pytest.mark.own_agent_servers]  # a driver is killed: its agents die as a user's do


def test_two_drivers_and_a_killed_one_record_every_point_once(tmp_path):
    figures = chaos(tmp_path / "runs", seed=0, grid=SMALL_GRID)
    assert figures["killed"], figures  # the kill came while the victim still ran
    print(figures)
