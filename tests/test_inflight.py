"""Running markers (scaling/inflight.py): what they hold, and how a live one is told from a stale one."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess

import psutil
import pytest

from scaling.engine.jobfiles import RUNNING_FILE
from scaling.store import inflight


def test_slurm_job_id_names_array_tasks_as_squeue_does():
    assert (
        inflight.slurm_job_id({"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "4"}) == "12_4"
    )
    assert inflight.slurm_job_id({"SLURM_JOB_ID": "17"}) == "17"
    assert inflight.slurm_job_id({}) is None


def test_marker_of_this_process_is_live_until_cleared(tmp_path):
    jd = tmp_path / "0123456789ab"
    inflight.mark_running(jd, {})
    marker = inflight.read_marker(jd)
    assert marker["state"] == inflight.RUNNING and marker["pid"] == os.getpid() and marker["slurm_job_id"] is None
    markers = inflight.read_markers(tmp_path)
    assert inflight.live_markers(markers, inflight.marker_states(markers)) == {jd.name: True}
    inflight.clear(jd)
    assert not (jd / RUNNING_FILE).exists() and inflight.read_markers(tmp_path) == {}


@pytest.mark.parametrize(
    "marker, states, live",
    [
        ({"slurm_job_id": "12_4"}, {"12_4": "PENDING"}, True),
        ({"slurm_job_id": "12_4"}, {"12_4": "RUNNING", "12_5": "PENDING"}, True),
        ({"slurm_job_id": "12_4"}, {"12_5": "RUNNING"}, False),  # squeue no longer lists it: ended
        ({"slurm_job_id": "12_4"}, None, None),  # no squeue to ask
        ({"host": "elsewhere", "pid": 1}, {}, None),  # another host's process cannot be checked from here
    ],
)
def test_is_live_asks_slurm_for_slurm_jobs_and_this_host_for_its_processes(marker, states, live):
    assert inflight.is_live(marker, states, socket.gethostname()) is live


@pytest.mark.parametrize("age_s, how", [(5, None), (50, "heartbeat 50 s old"), (100, "heartbeat 1.7 min old")])
def test_a_live_holder_whose_heartbeat_is_late_has_stalled(age_s, how):
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    beat = (now - dt.timedelta(seconds=age_s)).isoformat()
    marker = {"state": inflight.RUNNING, "host": "elsewhere", "pid": 1, "heartbeat_at": beat}
    assert inflight.stalled(marker, socket.gethostname(), now) == how


@pytest.mark.subprocess
def test_a_dead_or_reused_pid_is_stale():
    host = socket.gethostname()
    done = subprocess.Popen(["true"])
    done.wait()
    assert inflight.is_live({"host": host, "pid": done.pid, "pid_started_at": 0.0}, {}, host) is False
    me = psutil.Process()
    assert inflight.is_live({"host": host, "pid": me.pid, "pid_started_at": me.create_time()}, {}, host) is True
    # Same pid, another start time: the process that wrote the marker is gone and its pid was reused.
    assert inflight.is_live({"host": host, "pid": me.pid, "pid_started_at": me.create_time() - 3600}, {}, host) is False


@pytest.mark.subprocess
def test_slurm_states_is_none_without_squeue(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert inflight.slurm_states(["12_4"]) is None
    assert inflight.slurm_states([]) == {}


def test_a_queued_marker_never_replaces_the_task_s_own(tmp_path):
    inflight.mark_queued(tmp_path, "12_4")
    assert inflight.read_marker(tmp_path)["state"] == inflight.QUEUED
    inflight.clear(tmp_path)
    inflight.mark_running(tmp_path, {"SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "4"})
    inflight.mark_queued(tmp_path, "12_4")  # the driver, late: the task has started already
    marker = inflight.read_marker(tmp_path)
    assert marker["state"] == inflight.RUNNING and marker["slurm_job_id"] == "12_4"
    assert [p.name for p in tmp_path.iterdir()] == [RUNNING_FILE]
