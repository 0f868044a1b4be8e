"""How a finished job is classified (pure), and which processes a launch ends (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from scaling.engine import worker
from scaling.engine.agent import FORK_ENV, forked
from scaling.launch.devices import LOCK_DIR_ENV
from scaling.launch.slurm import Placement, srun_argv
from scaling.launch.torchrun import (
    WORKER,
    classify,
    error_messages,
    job_env,
    launch_torchrun,
    srun_named,
    step_name,
    torchrun_argv,
)
from scaling.launch.warm import shape_of
from tests.helpers.compose import compose_point


def test_a_peers_dropped_connection_is_not_the_root_cause(tmp_path):
    for rank, (stamp, message) in enumerate(
        [
            (
                "100",
                "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:42674. This is typically caused "
                "by a remote worker crashing.",
            ),
            ("100", "RuntimeError: injected fault: rank 1 crashed on purpose (train.fault=crash)"),
        ]
    ):
        path = tmp_path / "elastic" / "run" / "attempt_0" / str(rank) / "error.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": stamp}}}))
    status, error = classify(1, False, error_messages(tmp_path), "", 60)
    assert (status, error) == ("failed", "RuntimeError: injected fault: rank 1 crashed on purpose (train.fault=crash)")


def test_an_agent_ended_by_a_signal_is_said_so_not_by_its_logs_last_line():
    """A killed agent (or the server it was forked from) leaves no rank's error: the log's last line is whatever a
    rank printed last (here the profiler's), so the error says what ended the agent."""
    tail = "[rank0]: step 3\nUSDT:2026-11-30 06:45:27 9834:9834 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
    assert classify(-9, False, [], tail, 60) == ("failed", "torchrun's agent was ended by SIGKILL, no rank said why")
    assert classify(1, False, [], tail, 60)[1].endswith("profiler_stop")  # an exit of its own: its log says it


# A job that leaves a process behind in a session of its own (as a rank outliving its torchrun would), writes its
# pid, and exits 0.
LEAVES_ONE_BEHIND = textwrap.dedent("""\
    import subprocess, sys
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    open(sys.argv[1], "w").write(str(left.pid))
    """)


@pytest.mark.subprocess
def test_a_launch_ends_the_processes_it_started_and_no_one_elses(tmp_path):
    """By identity, never by name: the straggler the launch left in another session is ended, while a process whose
    command line names the same config.json (another driver's torchrun, someone's `less`) is left alone."""
    config = tmp_path / "config.json"
    config.write_text("{}")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(config)])
    try:
        argv = [sys.executable, "-c", LEAVES_ONE_BEHIND, str(tmp_path / "left.pid"), str(config)]
        outcome = launch_torchrun(argv, tmp_path, 60, dict(os.environ))
        assert outcome.status == "ok", outcome.error
        left = int((tmp_path / "left.pid").read_text())
        time.sleep(0.2)
        assert not psutil.pid_exists(left) or psutil.Process(left).status() == psutil.STATUS_ZOMBIE
        assert bystander.poll() is None, "a process that only names the point's config.json was ended"
    finally:
        bystander.kill()
        bystander.wait()


def test_off_cuda_the_agent_forks_its_ranks_from_the_module_it_was_given(monkeypatch):
    """torchrun's own fork start (scaling/engine/agent.py): the module's file run in each forked rank with the same
    arguments; on CUDA, or where the user set FORK_ENV=0, the ranks are fresh interpreters."""
    monkeypatch.delenv(FORK_ENV, raising=False)
    assert job_env(4, None, False)[FORK_ENV] == "1" and FORK_ENV not in job_env(4, "0", True)
    monkeypatch.setenv(FORK_ENV, "0")
    assert job_env(4, None, False)[FORK_ENV] == "0"
    agent_args = torchrun_argv(WORKER, ["--serve", "pool"], 2)[3:]  # after `python -m scaling.engine.agent`
    args, module = forked(agent_args)
    assert module == WORKER and args[:3] == agent_args[:3]
    assert args[3:] == ["--start-method=fork", "--run-path", worker.__file__, "--serve", "pool"]


def test_cuda_ranks_grow_their_allocators_segments_in_place_unless_the_user_chose_a_setting(monkeypatch):
    """Under the default caching allocator a point predicted within 5% of an H200 ran out of memory with 6.7 GiB
    reserved but free; with growable segments it ran at the predicted peak (benchmarks/RESULTS.md)."""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert job_env(4, "0", True)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in job_env(4, None, False)  # nothing to set off CUDA
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:native")
    assert job_env(4, "0", True)["PYTORCH_CUDA_ALLOC_CONF"] == "backend:native"


def test_a_launch_through_srun_names_its_job_step_after_itself_and_a_local_one_is_left_as_it_is():
    run = torchrun_argv("scaling.engine.worker", ["c.json"], 2, nnodes=2, rendezvous=("h1:29400", "r"))
    srun = srun_argv(Placement(nodes=2, nproc_per_node=2, via_srun=True), ["h1", "h2"])
    named = srun_named([*srun, *run], "tok")
    assert named[:2] == ["srun", f"--job-name={step_name('tok')}"] and named[2:] == [*srun[1:], *run]
    assert srun_named(run, "tok") == run


def test_points_share_a_warm_job_when_their_ranks_would_see_the_same_not_where_the_driver_leases():
    """A warm job's shape holds the environment its ranks read (a thread setting apart is another job) but not the
    device lock directory, which only the driver reads to take its lease: points of drivers that lease elsewhere,
    or of one driver whose environment names another directory later, run on the same warm ranks."""
    cfg = compose_point(["model=tiny", "parallel.dp=2"])
    ranks_see = {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    here = shape_of(cfg, None, {**ranks_see, LOCK_DIR_ENV: "/tmp/locks-a"})
    assert shape_of(cfg, None, {**ranks_see, LOCK_DIR_ENV: "/tmp/locks-b", "PYTEST_CURRENT_TEST": "t"}) == here
    assert shape_of(cfg, None, ranks_see) == here
    assert shape_of(cfg, None, {**ranks_see, "OMP_NUM_THREADS": "2", LOCK_DIR_ENV: "/tmp/locks-a"}) != here
    assert shape_of(compose_point(["model=tiny", "parallel.dp=1"]), None, ranks_see) != here


def test_a_rank_the_collective_timeout_aborted_is_a_timeout_by_its_log():
    """A waiting rank that gloo's timeout aborted leaves only its signal in the error file; its log says why."""
    log = "step 0\n[E gloo] Timed out waiting 30000ms for recv operation to complete\nterminate called\n"
    status, error = classify(-6, False, ["Signal 6 (SIGABRT) received by PID 11087"], log, 60)
    assert status == "timeout" and "process-group timeout" in error and "Timed out waiting 30000ms" in error
    # a signal without a timeout in the log stays a failure, and a rank's own error is not overruled by the log
    assert classify(-6, False, ["Signal 6 (SIGABRT) received by PID 1"], "step 0\n", 60)[0] == "failed"
    assert classify(1, False, ["RuntimeError: boom"], log, 60) == ("failed", "RuntimeError: boom")
    # aborted before it could write an error file (the heap found corrupted as it left, after the timeout's error):
    # no error file at all, the timeout in the log, as a loaded host's run left it
    aborted = (
        "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation to "
        "complete\nmalloc(): unsorted double linked list corrupted\nFatal Python error: Aborted\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 15774\n"
    )
    status, error = classify(-6, False, [], aborted, 60)
    assert status == "timeout" and "Timed out waiting 8000ms" in error, error
    assert classify(-6, False, [], "step 0\n  traceback : Signal 6 (SIGABRT) received by PID 1\n", 60)[0] == "failed"
    # and an out-of-memory error in that log still wins over the timeout its peer then met
    assert classify(-6, False, [], "torch.OutOfMemoryError: rank 1\n" + aborted, 60)[0] == "oom"
