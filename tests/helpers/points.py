"""Real points shared by the test modules that look at them: one record store for the session (the `point_store`
fixture), so a config that several tests measure (the DP-split points above all) runs once, also when the suite runs
on several workers (the store is theirs in common; a point another worker is running is waited for, not run twice).
Each worker measures its points on warm ranks (tests/test_warm.py shows they measure what fresh launches do)."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any

from scaling.job.run import run_point
from scaling.store.record import job_key
from tests.helpers.compose import compose_point

TIMEOUT = "launch.timeout_s=180"
"""The timeout of the points run here, which fixes their ranks' process-group timeout: part of a warm job's shape, so a
test whose points should share this worker's warm jobs (of another model, say) gives it too, with ON_WARM_RANKS."""
ON_WARM_RANKS = [TIMEOUT, "launch.reuse=true", "launch.reuse_idle_s=600"]
"""What a point gives to run on this worker's warm jobs and leave them up for the next test's points: the last point a
job ran sets how long it waits idle (launch.reuse_idle_s, 30 s by default), so a point of another test that shares a
job gives BASE's wait too."""
BASE = [
    "logger=none",
    "model=tiny",
    "train.mbs=2",
    "train.warmup_steps=2",
    "train.steps=3",
    "train.precision=fp32",
    *ON_WARM_RANKS,
]
"""A tiny point on CPU: two warm-up steps (the CPU floor: the second is memory-tracked) and three timed ones, run on
the warm ranks of this test process (launch.reuse: not part of the job key), which stay up between tests (idle ranks
hold memory, not cores; a driver another test starts on this worker's lease takes it from them within a second). A
test whose subject is a fresh launch (its start-up, its resident memory, its processes) adds `FRESH`."""
FRESH = "launch.reuse=false"
ONE_STEP = ["logger=none", "model=tiny", "train.seq_len=32", "train.mbs=2", "train.warmup_steps=0", "train.steps=1"]
"""The cheapest real point (the CPU floor of two warm-up steps, one timed), for tests whose subject is the store or
the launch around it, not the measurement."""
CLIP = "train.grad_clip=0.05"
"""Below the tiny model's gradient norms: every step clips. The DP-split points clip so; tests that look at other
things of the same configs add it too, so that they read those points instead of launching their own."""


def point(store: Path, *overrides: str) -> dict[str, Any]:
    """The record of BASE plus `overrides`: run now, or fetched from the store when an earlier test ran it."""
    cfg = compose_point([*BASE, *overrides], store)
    with open(store / f"{job_key(cfg)}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return run_point(cfg)
