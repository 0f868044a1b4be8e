"""Warm ranks (launch.reuse): points of one shape measured one after another by the ranks of one torchrun job.

Each point must come out as a fresh launch would measure it (the same losses and weights, and tracked peak bytes
equal or, where gloo's thread frees collective buffers at its own time, within one such buffer), a
point that fails must not take the points after it down, and a killed driver must leave no rank and exactly one
record per finished point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from scaling.engine.agent import FORK_ENV, SERVER_ENV
from scaling.engine.jobfiles import RESULT_FILE
from scaling.launch import warm
from scaling.launch.devices import LOCK_DIR_ENV
from scaling.perf.step_model import MODULE_GRADS, MODULE_PARAMS
from scaling.store.record import launch_dir
from tests.helpers.compose import workload_of
from tests.helpers.points import BASE, CLIP, FRESH, point
from tests.helpers.processes import processes_mentioning

pytestmark = pytest.mark.torchrun  # its points run on torchrun ranks (the session's point store)

REPO = Path(__file__).resolve().parents[1]
WARM = ["launch.reuse=true", "launch.reuse_idle_s=60"]
SAME = ("losses", "grad_norms", "final_param_norm", "peak_mem_bytes_per_rank", "optimizer_state_bytes_per_rank")
"""What a point measures that must not depend on what the ranks ran before (tokens/s is timing: noise)."""


def largest_fsdp_buffer_bytes(record: dict) -> int:
    """The largest buffer one FSDP2 all-gather or reduce-scatter of this point moves (the step model's calls)."""
    w, n = workload_of(record["config"], record["derived"]["grad_acc"]), record["derived"]["world_size"]
    return max(size for moves in (MODULE_PARAMS, MODULE_GRADS) for size, _ in w.calls_of(moves, n))


@pytest.fixture(autouse=True)
def _own_warm_jobs():
    """Each test here ends the warm jobs it started (other tests leave theirs up, and a point here may be a turn of
    one of those: the turns are counted from the test's first point)."""
    before = set(map(id, warm._jobs.values()))
    yield
    for job in list(warm._jobs.values()):
        if id(job) not in before:
            warm._end(job)


def job_of_last_point() -> warm.WarmJob:
    """The warm job of this process that measured the latest point."""
    return max(warm._jobs.values(), key=lambda j: j.last_used)


SHAPE = ["parallel.dp=2", "hardware.memory_gb=0.005"]
"""5 MB: the tiny model at seq 32 fits, at seq 256 x mbs 4 it does not; one capacity, so one shape and one job."""
TOO_BIG = ["train.seq_len=256", "train.mbs=4", "launch.prescreen=false"]
ZERO3 = ["train.seq_len=32", "train.grad_acc=2", "parallel.zero_stage=3", CLIP]
ZERO2 = ["train.seq_len=32", "train.grad_acc=2", "parallel.zero_stage=2"]
ZERO1 = ["train.seq_len=32", "train.grad_acc=2", "parallel.zero_stage=1"]


@pytest.fixture(scope="module")
def warm_then_fresh(tmp_path_factory) -> Iterator[dict]:
    """One warm job of SHAPE and the fresh launches it is compared with, for the three tests below: a ZeRO-0 point,
    one past the capacity and a ZeRO-3 point on the job's ranks (its `warm` store); the point past the capacity by a
    fresh launch while the job is idle; then, on the same job, a rank out of memory on its own, a point, a crashed
    rank and a point (its `faults` store: each failure ends its job, so they run on three jobs); then the last job's
    ranks killed while its torchrun still looks alive (stopped, so the race is not left to chance) and the ZeRO-3
    point handed to it, which a fresh launch then measures (its `fresh` store): the fresh launch the warm ZeRO-3
    point is compared with. What each step saw, by name."""
    root = tmp_path_factory.mktemp("warm_then_fresh")
    warm_store, fresh_store, faults_store = root / "warm", root / "fresh", root / "faults"
    for store in (warm_store, fresh_store, faults_store):
        store.mkdir()
    started_before = set(map(id, warm._jobs.values()))
    seen: dict = {"warm_store": warm_store, "fresh_store": fresh_store, "faults_store": faults_store}
    # A lock directory of its own, as each test has (conftest.py): set up before any test's, this fixture would
    # otherwise lease the host's, where a driver of another run on the host would end the idle job.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LOCK_DIR_ENV, str(root / "device-locks"))
        yield from _warm_then_fresh(warm_store, fresh_store, started_before, seen)


def _warm_then_fresh(warm_store: Path, fresh_store: Path, started_before: set, seen: dict) -> Iterator[dict]:
    try:
        seen["before"] = point(warm_store, *SHAPE, "train.seq_len=32", "train.grad_acc=2", *WARM)
        seen["oom"] = point(warm_store, *SHAPE, *TOO_BIG, *WARM)
        seen["after"] = point(warm_store, *SHAPE, *ZERO3, *WARM)
        # Between points the ranks block on their wake pipes: no polling on the cores the next point is measured on
        # (a 20 ms poll woke each rank about 50 times a second).
        job = job_of_last_point()
        torchrun_proc = psutil.Process(job.proc.pid)
        ranks = torchrun_proc.children(recursive=True)
        time.sleep(0.3)
        before_idle = [r.num_ctx_switches().voluntary for r in ranks]
        time.sleep(1.0)
        seen["ranks"] = len(ranks)
        seen["woken"] = [r.num_ctx_switches().voluntary - b for r, b in zip(ranks, before_idle)]
        jobs = list(warm._jobs.values())
        with pytest.MonkeyPatch.context() as mp:  # fresh interpreters, as CUDA's ranks are (FORK_ENV: forked on CPU)
            mp.setenv(FORK_ENV, "0")
            seen["fresh_oom"] = point(fresh_store, *SHAPE, *TOO_BIG, FRESH)
        # the fresh launch neither ended the warm job nor started one
        seen["job_kept"] = list(warm._jobs.values()) == jobs and job.alive

        # A rank that fails on its own ends the job it runs on; the point after it starts a new one.
        faults = seen["faults_store"]
        seen["faulted"] = [
            point(faults, *SHAPE, *ZERO2, "train.fault=oom", *WARM),
            point(faults, *SHAPE, *ZERO1, *WARM),
            point(faults, *SHAPE, *ZERO2, "train.fault=crash", *WARM),
            point(faults, *SHAPE, *ZERO2, *WARM),
        ]

        # The last job's ranks die between two points; the point handed to it was never started.
        job = job_of_last_point()
        torchrun_proc = psutil.Process(job.proc.pid)
        ranks = torchrun_proc.children(recursive=True)
        torchrun_proc.suspend()
        for rank in ranks:
            rank.kill()
        psutil.wait_procs(ranks, timeout=10)
        handed = job.pool_dir / f"command-{job.points}.json"
        done: list = []
        runner = threading.Thread(target=lambda: done.append(point(fresh_store, *SHAPE, *ZERO3, *WARM)), daemon=True)
        with pytest.MonkeyPatch.context() as mp:  # its fresh launch a fresh agent too: interpreter, imports and all
            mp.setenv(SERVER_ENV, "0")
            runner.start()
            deadline = time.monotonic() + 120
            while not handed.exists() and runner.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["handed"] = handed.exists()
            torchrun_proc.kill()
            runner.join(timeout=300)
        (seen["fresh"],) = done
        yield seen
    finally:
        for job in list(warm._jobs.values()):
            if id(job) not in started_before:
                warm._end(job)


def test_a_point_on_warm_ranks_measures_what_a_fresh_launch_does_also_after_one_past_its_capacity(warm_then_fresh):
    """ZeRO-3 on the ranks that have just run a ZeRO-0 point (DDP's reducer, another optimizer) and then a point
    whose tracked step passed the emulated capacity (every rank raises it together at the end of that step: `oom`,
    with the fresh launch's message, and the job goes on) equals its fresh launch: losses, gradient norms, weights
    and optimizer bytes exactly; the tracked peak within one FSDP2 collective buffer, which is what two fresh
    launches differ by (gloo's worker thread drops the last reference to a finished all-gather's or reduce-scatter's
    buffers at its own time, before or after the main thread's next allocation). The records say which turn of the
    job each was, and a turn paid no start-up. The fresh launch in this process shares its lease with the idle
    warm job (CPU), which is still up after it."""
    seen = warm_then_fresh
    before, oom, after = seen["before"], seen["oom"], seen["after"]
    fresh_oom, fresh = seen["fresh_oom"], seen["fresh"]
    assert seen["ranks"] == 2 and max(seen["woken"]) <= 5, seen["woken"]  # idle ranks block on their wake pipes
    assert seen["job_kept"]  # the fresh launch neither ended the warm job nor started one
    assert before["status"] == after["status"] == fresh["status"] == "ok", (after["error"], fresh["error"])
    assert oom["status"] == fresh_oom["status"] == "oom"
    assert oom["error"] == fresh_oom["error"] and "emulated capacity exceeded" in oom["error"], oom["error"]
    assert after["job_key"] == fresh["job_key"]  # launch settings are not part of the key
    for name in SAME:
        if name != "peak_mem_bytes_per_rank":
            assert after["metrics"][name] == fresh["metrics"][name], name
    peaks = after["metrics"]["peak_mem_bytes_per_rank"], fresh["metrics"]["peak_mem_bytes_per_rank"]
    race = largest_fsdp_buffer_bytes(fresh)
    assert all(abs(w - f) <= race for w, f in zip(*peaks)), (peaks, race)
    turn = [r["repeats"][0]["timing"]["points_before"] for r in (before, oom, after, fresh)]
    assert turn[1:] == [turn[0] + 1, turn[0] + 2, 0], turn  # one job throughout
    # No interpreter, no torch import, no process group: the turn takes less than the fresh launch's start-up (a fresh
    # agent's: one forked from the driver's agent server skips the first two as well).
    held = after["repeats"][0]["timing"]["torchrun_wall_s"]
    assert held < fresh["repeats"][0]["timing"]["startup_device_s"] / 2, (held, fresh["repeats"][0]["timing"])
    log = (launch_dir(seen["warm_store"] / after["job_key"], after) / "torchrun.log").read_text()
    assert "Traceback" not in log  # the point's own part of the job's log
    assert len(list(seen["warm_store"].glob("*/result.json"))) == 3


def test_a_failing_point_ends_its_warm_job_and_the_next_point_starts_a_new_one(warm_then_fresh):
    """A rank that runs out of memory on its own (train.fault=oom: as on a real device, its peer may be waiting
    inside a collective) and a crashed rank, each in the middle of a warm job, end it: the point is classified as
    a fresh launch's would be, and the point after it runs on the ranks of a new job, from their start as a fresh
    launch's do. One record per point (the faults of `warm_then_fresh`, after its ZeRO-3 point on the same job)."""
    seen = warm_then_fresh
    store, first = seen["faults_store"], seen["after"]
    oom, after_oom, crash, after_crash = seen["faulted"]
    turns = [r["repeats"][0]["timing"]["points_before"] for r in (first, oom, after_oom, crash, after_crash)]
    assert turns[1:] == [turns[0] + 1, 0, 1, 0], turns
    assert oom["status"] == "oom" and "rank 1 ran out of memory on purpose" in oom["error"], oom["error"]
    assert oom["repeats"][0]["timing"]["torchrun_wall_s"] < 30  # the job ended; no wait for the point's timeout
    assert (crash["status"], crash["error"]) == (
        "failed",
        "RuntimeError: injected fault: rank 1 crashed on purpose (train.fault=crash)",
    )
    assert (launch_dir(store / crash["job_key"], crash) / "elastic").is_dir()  # the failed launch keeps the error files
    assert first["status"] == after_oom["status"] == after_crash["status"] == "ok"
    assert len(list(store.glob("*/result.json"))) == 4  # and the first, in the `warm` store


@pytest.mark.own_agent_servers
def test_killing_the_driver_during_a_warm_job_leaves_no_rank_and_one_record_per_point(tmp_path):
    """A multirun of three points on warm ranks, its driver SIGKILLed while the second runs: nothing is left
    running, the first point has its record and the second none; the re-run records the other two, once each."""
    sweep_dir, tmp = tmp_path / "sweep", tmp_path / "tmp"
    tmp.mkdir()
    argv = [
        sys.executable,
        "-m",
        "scaling",
        "run",
        "-m",
        *BASE,
        *WARM,
        "parallel.dp=1",  # one rank: what is tested is the driver, its job and its records, not the collectives
        "train.steps=3,60,4",  # the second point runs long enough (a second or more) to be caught running
        f"sweep_dir={sweep_dir}",
    ]
    env = {**os.environ, "TMPDIR": str(tmp)}  # the warm job's folder, named in its ranks' command lines
    driver = subprocess.Popen(
        argv, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp.glob("scaling-warm-*/command-1.json")):
            assert time.monotonic() < deadline and driver.poll() is None, "the second point was never handed out"
            time.sleep(0.02)
        assert processes_mentioning(str(tmp))  # the warm ranks, running the second point
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 10
    while processes_mentioning(str(tmp)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_mentioning(str(tmp)) == []
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{RESULT_FILE}")]
    assert [r["config"]["train"]["steps"] for r in records] == [3]
    rerun = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert "Grid of 3 points: 1 Hydra compositions, 1 answered by the store" in rerun.stdout  # not launched again
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{RESULT_FILE}")]
    assert sorted(r["config"]["train"]["steps"] for r in records) == [3, 4, 60]
    assert all(r["status"] == "ok" and len(r["repeats"]) == 1 for r in records)
    assert processes_mentioning(str(tmp)) == []


def test_a_warm_job_that_dies_before_taking_a_point_leaves_it_to_a_fresh_launch(warm_then_fresh):
    """The job's ranks die between two points while its torchrun still looks alive (stopped, so the race is not
    left to chance); the point handed to it was never started: it is measured by a fresh launch and ok, not
    recorded `failed` (the ZeRO-3 point of `warm_then_fresh`, handed to its last job after that job's first point)."""
    seen = warm_then_fresh
    assert seen["handed"], "the point was never handed to the warm job"
    second = seen["fresh"]
    assert second["status"] == "ok", second["error"]
    assert len(second["repeats"]) == 1 and second["repeats"][0]["timing"]["points_before"] == 0  # a fresh launch
    assert len(list(seen["fresh_store"].glob("*/result.json"))) == 2  # and the fresh point past the capacity
