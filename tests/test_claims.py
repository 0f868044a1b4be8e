"""A point is claimed, not guessed: two drivers of one point run it once, a live holder on another host is waited
for, a dead one's claim is taken over and the record says whose."""

from __future__ import annotations

import datetime as dt
import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from scaling.engine.jobfiles import RESULT_FILE, RUNNING_FILE
from scaling.job.run import run_point
from scaling.store import inflight
from scaling.store.record import job_dir, job_key
from tests.helpers.compose import REPO, compose_point
from tests.helpers.points import ONE_STEP as FAST

INVALID = [*FAST, "train.grad_acc=0"]
"""A point recorded `invalid` by the validation: a record without a launch."""


def _now(seconds_ago: float = 0.0) -> str:
    return (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds_ago)).isoformat(timespec="seconds")


def _plant(point_dir, **marker) -> dict:
    point_dir.mkdir(parents=True, exist_ok=True)
    marker = {"state": "running", "started_at": _now(600), "slurm_job_id": None, **marker}
    (point_dir / RUNNING_FILE).write_text(json.dumps(marker))
    return marker


@pytest.mark.torchrun
def test_two_drivers_of_one_point_run_it_once(tmp_path):
    """Two `scaling run` processes of the same point at once: one launches it, the other waits for its claim, finds
    the record and runs nothing; one record, attempt 1, one launch."""
    args = [sys.executable, "-m", "scaling", "run", *FAST, f"sweep_dir={tmp_path}", "hydra.run.dir=" + str(tmp_path)]
    drivers = [
        subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)
    ]
    outputs = [d.communicate(timeout=300)[0] for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], outputs
    records = list(tmp_path.glob(f"*/{RESULT_FILE}"))
    assert len(records) == 1, outputs
    record = json.loads(records[0].read_text())
    assert record["status"] == "ok" and record["provenance"]["attempt"] == 1
    assert len(record["repeats"]) == 1
    waited = [o for o in outputs if "waiting for its record" in o]
    ran = [o for o in outputs if " ok tokens/s/GPU=" in o]
    assert len(ran) == 1 and len(waited) == 1, outputs
    assert "while this run waited: skipped" in waited[0]
    assert not (records[0].parent / RUNNING_FILE).exists()


def test_a_fresh_claim_from_another_host_is_waited_for(tmp_path):
    """A marker another host keeps beating holds the point: nothing is recorded until it is gone."""
    cfg = compose_point(INVALID, tmp_path)
    point_dir = job_dir(tmp_path, job_key(cfg))
    _plant(point_dir, host="elsewhere", pid=1, heartbeat_at=_now())
    done: list = []
    runner = threading.Thread(target=lambda: done.append(run_point(cfg)), daemon=True)
    runner.start()
    time.sleep(1.5)
    assert runner.is_alive() and not (point_dir / RESULT_FILE).exists()
    (point_dir / RUNNING_FILE).unlink()  # its holder finished without a record (or was declared gone)
    runner.join(timeout=60)
    assert done and done[0]["status"] == "invalid"
    assert done[0]["provenance"]["took_over"] is None


@pytest.mark.subprocess  # the dead holder
@pytest.mark.parametrize("host", ["this", "elsewhere"])
def test_a_dead_holders_claim_is_taken_over_and_recorded(tmp_path, host):
    """On this host a marker whose pid is dead, from another a heartbeat older than STALE_AFTER_S: taken over at
    once, and the record names the run it replaced."""
    cfg = compose_point(INVALID, tmp_path)
    point_dir = job_dir(tmp_path, job_key(cfg))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = _now(inflight.STALE_AFTER_S + 60)
    planted = _plant(
        point_dir,
        host=socket.gethostname() if host == "this" else "elsewhere",
        pid=dead.pid,
        pid_started_at=0.0,
        heartbeat_at=stale,
    )
    record = run_point(cfg)
    assert record["status"] == "invalid"
    assert record["provenance"]["took_over"] == planted
    assert not (point_dir / RUNNING_FILE).exists()
