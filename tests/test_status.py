"""`scaling status`: the counting (pure), and the command on a sweep from another process while it runs, after
the driver is killed, once it is finished, and on a directory that holds no sweep."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from scaling.engine.lifetime import GATE_ENV
from scaling.sweep.standing import render, summarize
from tests.helpers.cli import scaling
from tests.helpers.compose import REPO
from tests.helpers.records import make_record, write_sweep

STANDIN = REPO / "tests" / "standin_app" / "standin_app.py"

T0 = "2026-01-01T10:00:00+00:00"


def rec(status, started=T0, wall_s=10.0):
    return {
        "status": status,
        "timing": {"started_at": started, "wall_s": wall_s},
        "repeats": [{"status": status, "metrics": None, "timing": {}}],
    }


def test_summarize_counts_done_in_flight_to_run_and_stale():
    index = {"name": "g", "runs": [{"started_at": T0, "rerun": "failed", "job_keys": list("abcdefgh")}]}
    records = {
        "a": rec("ok", wall_s=10.0),
        "b": rec("oom", wall_s=30.0),
        "c": rec("failed", "2025-12-31T00:00:00+00:00"),
        "d": rec("failed", "2026-01-01T10:05:00+00:00"),
        "z": rec("ok"),
    }  # z: not in this run's grid
    markers = {
        "e": {"state": "queued", "slurm_job_id": "7_1"},
        "f": {"state": "queued", "slurm_job_id": "7_2"},
        "g": {"state": "running", "pid": 1, "host": "n1", "started_at": T0},
        "h": {"state": "running", "pid": 2, "host": "n1"},
    }
    live = {"e": True, "f": True, "g": True, "h": False}
    s = summarize("/s", index, records, markers, live, states={"7_1": "PENDING", "7_2": "RUNNING"})
    # c failed before this run started and rerun=failed runs it again; d failed in this run: done.
    assert s.done == Counter({"ok": 1, "oom": 1, "failed": 1}) and s.grid_points == 8
    assert [(f.job_key, f.state) for f in s.in_flight] == [("e", "queued"), ("f", "running"), ("g", "running")]
    assert s.to_run == 2 and len(s.stale) == 1 and s.stale[0].startswith("h: pid 2 on n1 is gone")
    assert s.not_in_grid == 1  # z
    assert s.median_wall_s == 10.0 and s.launched == 4 and s.at_once == 2
    assert s.eta_s == 3 * 10.0  # (2 to run + 3 in flight) in waves of 2, of the median
    lines = render(s, dt.datetime.fromisoformat(T0) + dt.timedelta(minutes=10))
    assert lines[0] == "sweep g (/s): run 1, started 2026-01-01 10:00:00 UTC (10.0 min ago), 8 points in its grid"
    assert lines[1] == "  done         3  1 ok, 1 oom, 1 failed"
    assert lines[2] == "  running      2  f since ? (SLURM job 7_2)" and lines[3].endswith(
        "g since 10:00:00 (pid 1 on n1)"
    )
    assert "  queued       1  SLURM jobs 7_1" in lines and "  to run       2" in lines
    assert "  not in the current grid: 1 (records of another grid or key; `scaling report` reads them)" in lines
    assert lines[-1] == "  time     median 10.0 s per launched point (4 recorded); about 30 s left at 2 at once"


def test_a_stalled_holder_is_listed_apart_and_left_out_of_the_time_left():
    """A live holder that does not progress (its process stopped, or its heartbeat late) is neither running nor to
    run: it is named with how it stalled, and the time left says it is not counted."""
    index = {"name": "g", "runs": [{"started_at": T0, "rerun": "none", "job_keys": ["a", "s", "t"]}]}
    marker = {"state": "running", "pid": 7, "host": "vm", "started_at": T0}
    s = summarize(
        "/s", index, {"a": rec("ok")}, {"s": marker}, {"s": True}, stalled={"s": "stopped, heartbeat 3.0 min old"}
    )
    assert s.in_flight == [] and s.to_run == 1 and s.eta_s == 10.0
    lines = render(s, dt.datetime.fromisoformat(T0))
    assert f"  stalled      1  s: pid 7 on vm (since {T0}), stopped, heartbeat 3.0 min old" in lines, lines
    assert lines[-1].endswith("about 10 s left at 1 at once, 1 stalled point not counted")


def test_a_predicted_oom_point_in_the_prescreen_sample_is_to_run_as_run_point_decides():
    """`scaling status` judges a point done by the store's one rule (scaling.store.record.answers)."""
    from scaling.core.sample import sampled

    keys = [f"{i * 7919:012x}" for i in range(40)]
    inside = {k for k in keys if sampled(k, 0.5)}
    assert 0 < len(inside) < len(keys)
    earlier = "2025-12-31T00:00:00+00:00"  # recorded by an earlier run
    records = {k: rec("predicted_oom", earlier) for k in keys}
    run = {"started_at": T0, "rerun": "none", "repeats": 1, "job_keys": keys}
    s = summarize("/s", {"name": "g", "runs": [{**run, "prescreen_sample": 0.5}]}, records, {}, {})
    assert s.done == Counter({"predicted_oom": len(keys) - len(inside)}) and s.to_run == len(inside)
    old = summarize("/s", {"name": "g", "runs": [run]}, records, {}, {})  # sweep.json from before the sample was kept
    assert old.done == Counter({"predicted_oom": len(keys)}) and old.to_run == 0


def test_summarize_without_a_grid_counts_every_record():
    s = summarize("/s", None, {"a": rec("ok"), "b": rec("invalid", wall_s=0.1)}, {}, {})
    assert s.grid_points is None and s.to_run is None and s.done == Counter({"ok": 1, "invalid": 1})
    assert s.not_in_grid is None
    lines = render(s, dt.datetime.now(dt.timezone.utc))
    assert "no grid" in lines[0] and not any("not in the current grid" in line for line in lines)


def status_json(sweep_dir) -> dict:
    """`scaling status --json`; {} before the sweep has written anything."""
    out = scaling("status", str(sweep_dir), "--json")
    assert out.returncode == 0 or "holds no sweep yet" in out.stderr, out.stderr
    return json.loads(out.stdout) if out.returncode == 0 else {}


def wait_for(ready, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail("timed out")


def test_a_directory_without_sweep_json_is_named_by_what_its_records_say():
    """A recipe's directory has records of single points and no sweep.json: its name is the one its records give
    (it printed `sweep ?`); records of two sweeps there name none."""
    now = dt.datetime.fromisoformat(T0)
    recipe = summarize(
        "runs/recipe", None, {"k1": {**rec("ok"), "sweep": "recipe"}, "k2": {**rec("oom"), "sweep": "recipe"}}, {}, {}
    )
    assert render(recipe, now)[0].startswith("sweep recipe (runs/recipe): no sweep.json")
    mixed = summarize(
        "runs/x", None, {"k1": {**rec("ok"), "sweep": "recipe"}, "k2": {**rec("ok"), "sweep": "demo"}}, {}, {}
    )
    assert render(mixed, now)[0].startswith("sweep ? (runs/x)")


@pytest.mark.subprocess
def test_status_counts_the_records_it_cannot_place_in_the_current_grid(tmp_path):
    """Records of an earlier grid (or an older schema's keys) are counted apart, in the text and the JSON alike."""
    grid, elsewhere = ["aaaaaaaaaaa1", "aaaaaaaaaaa2", "aaaaaaaaaaa3"], ["bbbbbbbbbbb1", "bbbbbbbbbbb2"]
    index = {"name": "g", "runs": [{"started_at": T0, "rerun": "none", "job_keys": grid}]}
    (tmp_path / "sweep.json").write_text(json.dumps(index))
    for key in [grid[0], *elsewhere]:
        (tmp_path / key).mkdir()
        (tmp_path / key / "result.json").write_text(json.dumps({"job_key": key, **rec("ok")}))
    status = status_json(tmp_path)
    assert status["not_in_grid"] == 2 and status["done"] == {"ok": 1} and status["to_run"] == 2
    text = scaling("status", str(tmp_path)).stdout.splitlines()
    assert "  not in the current grid: 2 (records of another grid or key; `scaling report` reads them)" in text


@pytest.mark.subprocess
def test_status_states_the_device_time_the_records_held_and_its_share_in_timed_steps(tmp_path):
    """Each synthetic launch held dp devices for 12 s; an ok one spent 9 s timed and 1 s warming up."""
    old = make_record("ok", mbs=4)  # recorded before device time was kept
    for block in (old["timing"], old["repeats"][0]["timing"]):
        for key in ("devices", "device_s", "timed_device_s", "warmup_device_s", "startup_device_s"):
            block.pop(key, None)
    records = [
        make_record("ok", dp=2),
        make_record("ok", dp=2, mbs=2),
        make_record("oom", dp=4),
        make_record("predicted_oom", mbs=8),
        old,
    ]
    write_sweep(tmp_path, records)
    spent = summarize(str(tmp_path), None, {r["job_key"]: r for r in records}, {}, {}).device_time
    assert (spent.records, spent.unknown, spent.device_s) == (3, 1, 2 * 24.0 + 48.0)
    assert (spent.timed_device_s, spent.warmup_device_s, spent.startup_device_s) == (36.0, 4.0, 8.0)
    assert spent.not_ok_device_s == 48.0 and spent.timed_frac == 36.0 / 96.0
    assert status_json(tmp_path)["device_time"] == dataclasses.asdict(spent)
    assert scaling("status", str(tmp_path)).stdout.splitlines()[-1] == (
        "  device   0.0267 device-h held by 3 points: 37.5% in timed steps, 4.2% warm-up, 8.3% start-up, "
        "50.0% launches not ok (1 more recorded before device time was kept)"
    )


def proc_state(pid: int) -> str:
    """What a process is doing, from /proc: its state, the signals it blocks, ignores and catches, where it waits."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as e:
        return f"pid {pid}: {e}"
    status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    fields = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    return ", ".join(f"{k} {status.get(k, '?').strip()}" for k in fields) + f", waiting in {wchan or '-'}"


@pytest.mark.subprocess
@pytest.mark.own_agent_servers
def test_status_of_a_sweep_while_it_runs_after_a_crash_and_when_done(tmp_path):
    """Stand-in points (tests/standin_app: the project's sweeper, callback and records, no torch); the second
    is held in flight at the test gate while `scaling status` looks from other processes, then the driver is
    SIGKILLed there, and a re-run launches exactly the points the store does not answer."""
    empty = tmp_path / "empty"
    empty.mkdir()
    out = scaling("status", str(empty))
    assert out.returncode == 1 and f"{empty} holds no sweep yet" in out.stderr and out.stdout == ""

    sweep_dir, gates = tmp_path / "runs", tmp_path / "gates"
    gates.mkdir()
    (gates / "job0.go").touch()  # the first point runs through; the second stops in flight
    args = [
        sys.executable,
        str(STANDIN),
        "-m",
        "logger=none",
        "parallel.dp=1,2",
        "parallel.zero_stage=0,1",
        f"sweep_dir={sweep_dir}",
    ]
    driver = subprocess.Popen(
        args,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env={**os.environ, GATE_ENV: str(gates)},
    )
    watch = subprocess.Popen(
        [sys.executable, "-m", "scaling", "status", str(sweep_dir), "--watch", "0.5"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        # Ctrl-C reaches it as it reaches a command in a terminal: a suite started in the background by a shell
        # without job control (`make test &`) ignores SIGINT and SIGQUIT, and its children inherit that.
        preexec_fn=functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []  # the watch's output so far, read as it comes
    errors: list[str] = []  # and its standard error: read too, so that a full pipe never blocks it
    readers = [
        threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")), daemon=True),
        threading.Thread(target=lambda: errors.extend(iter(watch.stderr.readline, "")), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        wait_for(lambda: (gates / "job1.reached").exists() or driver.poll() is not None)
        assert driver.poll() is None, "the driver ended before its second point"
        # The watch, refreshing in another process, shows the held point running, twice at least.
        running_line = r"running      1  ([0-9a-f]{12}) since \d\d:\d\d:\d\d \(pid "
        wait_for(lambda: len(re.findall(running_line, "".join(lines))) >= 2)
        # From another process: one point recorded, one running, two to run.
        seen = status_json(sweep_dir)
        (running,) = seen["in_flight"]
        assert seen["done"] == {"ok": 1} and seen["grid_points"] == 4 and seen["to_run"] == 2
        assert running["state"] == "running" and running["where"] == f"pid {driver.pid} on {socket.gethostname()}"
        # The watch's latest frame shows the held point (an earlier frame may show the first point while it ran).
        assert wait_for(lambda: re.findall(running_line, "".join(lines))[-1] == running["job_key"])
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        watch.send_signal(signal.SIGINT)
        try:
            watch.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the watch ignored Ctrl-C for 60 s: {proc_state(watch.pid)}; stderr: {''.join(errors)[-2000:]}"
            )
        for reader in readers:  # both pipes read to their end before what came through them is checked
            reader.join(timeout=60)
    finally:
        for proc in (driver, watch):
            proc.kill()
    watched = "".join(lines)
    assert errors == [], errors
    assert watch.returncode == 0 and watched.count("(every 0.5 s, Ctrl-C to stop;") >= 2
    keys = json.loads((sweep_dir / "sweep.json").read_text())["runs"][0]["job_keys"]
    assert running["job_key"] in keys  # the running point the watch showed is one of the sweep's

    crashed = status_json(sweep_dir)
    assert crashed["in_flight"] == [] and crashed["to_run"] == 3 and list(sweep_dir.rglob("*.tmp")) == []
    assert crashed["stale"] == [
        f"{running['job_key']}: pid {driver.pid} on {socket.gethostname()} is gone without "
        "a record (a re-run runs it again)"
    ]

    recorded = {path.parent.name for path in sweep_dir.glob("*/result.json")}
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[1/4] 1 points already recorded (1 ok): not launched again" in again.stdout
    ran = re.findall(r"^\[(\d)/4\] ([0-9a-f]{12}) ok ", again.stdout, re.M)
    assert [n for n, _ in ran] == ["2", "3", "4"] and {k for _, k in ran} == set(keys) - recorded  # the killed one too
    done = status_json(sweep_dir)
    assert done["done"] == {"ok": 4} and done["to_run"] == 0 and done["stale"] == [] and done["run"] == 2
    assert done["not_in_grid"] == 0
    assert done["launched"] == 4 and done["median_wall_s"] > 0 and done["eta_s"] == 0
    text = scaling("status", str(sweep_dir)).stdout.splitlines()
    assert text[1:] == [
        "  done         4  4 ok",
        "  to run       0",
        f"  time     median {done['median_wall_s']:.1f} s per launched point (4 recorded); nothing left to run",
    ]
