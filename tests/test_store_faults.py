"""A store under faults, with real drivers, ranks, signals and mounts: a driver stopped (SIGSTOP) while it holds a
claim and the device lease is named as stalled and gone past, and every point is recorded once after it goes on; a
disk that fills between a measurement and its record stops the run in one line, the measurement recorded, and a
re-run with space records the rest once; a read-only store is read by every command that only reads, and a run that
would write into it stops in one line.

Mounting needs root, as CI runs; elsewhere those tests skip and say why (tests/helpers/mounts.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from scaling.cli.main import main
from scaling.engine.lifetime import GATE_ENV, GATE_PHASES
from scaling.store.read import iter_records
from scaling.store.record import job_key
from tests.helpers.cli import scaling
from tests.helpers.compose import REPO, compose_point
from tests.helpers.mounts import ROOT_ONLY, fill, read_only, tmpfs

# real mounts, real drivers, stopped as a user's are (their agents in their own process groups)
pytestmark = [pytest.mark.subprocess, pytest.mark.own_agent_servers]

TWO_INVALID = """# two points past the tiny model's max_seq_len: recorded `invalid`, no process started
defaults:
  - config
  - _self_
sweep: faults
logger: {mode: disabled}
hydra:
  mode: MULTIRUN
  sweeper:
    params:
      train.seq_len: 600,700
"""


GRID = [
    "logger=none",
    "model=tiny",
    "train.mbs=1",
    "train.warmup_steps=0",
    "train.steps=1",
    "launch.reuse=true",
    "launch.timeout_s=120",
    "train.seq_len=16,24,32",
]
"""Three one-step tiny points on one rank each, on warm ranks (one job start a driver)."""


def _keys() -> list[str]:
    return [job_key(compose_point([*GRID[:-1], f"train.seq_len={n}"])) for n in (16, 24, 32)]


@contextlib.contextmanager
def _ended(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """`proc`, killed on the way out if it still runs (a test that fails leaves no driver behind)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"{path.name} never reached"
        time.sleep(0.05)


@pytest.mark.torchrun
def test_a_stopped_driver_is_named_stalled_gone_past_and_every_point_is_recorded_once_after_it_goes_on(tmp_path):
    """Driver A is stopped (its process group, as a suspended terminal is) while its ranks hold the first point's
    first step, so that it holds that point's claim and the host's lease. Driver B runs every other point beside the
    stopped A, leaves the held one after launch.stalled_wait_s, exits 1 naming it; `scaling status` says stalled. A,
    continued, records its point, its stopped time in no device time, and finds the others recorded."""
    store, gates = tmp_path / "store", tmp_path / "gates"
    gates.mkdir()
    for phase in [*GATE_PHASES[:-1], "measured"]:
        (gates / f"{phase}.go").touch()  # A's ranks stop at their first step only, its driver nowhere
    held, *others = _keys()
    with open(tmp_path / "a.log", "w") as log:
        a = subprocess.Popen(
            [sys.executable, "-m", "scaling", "run", "-m", *GRID, f"sweep_dir={store}"],
            cwd=REPO,
            env={**os.environ, GATE_ENV: str(gates)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with _ended(a):
        try:
            _wait_for(gates / "first_step.reached", a)
            os.killpg(a.pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            (gates / "first_step.go").touch()  # its ranks measure the point and go idle; its driver stays stopped
            b = scaling("run", "-m", *GRID, f"sweep_dir={store}", "launch.stalled_wait_s=1")
            b_wall_s = time.monotonic() - stopped_at
            status = scaling("status", str(store))
        finally:
            os.killpg(a.pid, signal.SIGCONT)
            continued_at = time.monotonic()
        assert a.wait(timeout=180) == 0, (tmp_path / "a.log").read_text()[-3000:]

    host = f"pid {a.pid} on {socket.gethostname()}"
    assert b.returncode == 1, b.stdout[-3000:] + b.stderr[-3000:]
    assert "sweep adhoc: 3 points: 2 ok, 1 not run" in b.stdout, b.stdout
    assert f"not run {held}: held by {host}" in b.stdout and "stalled (stopped" in b.stdout, b.stdout
    assert "waited launch.stalled_wait_s=1 s" in b.stdout and b_wall_s < 300  # not lease_wait_s's hour
    assert f"going past cpu-host.lock, held by pid {a.pid}" in b.stderr, b.stderr
    assert f"{held}: {host}" in b.stderr and "has stalled (stopped" in b.stderr, b.stderr
    assert f"  stalled      1  {held}: {host} (since " in status.stdout and ", stopped" in status.stdout, status.stdout

    records = {r["job_key"]: r for r in iter_records(store)}
    assert sorted(records) == sorted([held, *others]) and {r["status"] for r in records.values()} == {"ok"}
    assert all(r["provenance"]["attempt"] == 1 and len(r["repeats"]) == 1 for r in records.values())
    assert all(r["repeats"][0]["timing"]["stopped_s"] is None for key, r in records.items() if key != held)
    timing = records[held]["repeats"][0]["timing"]
    assert timing["stopped_s"] >= continued_at - stopped_at - 3.0, (timing, continued_at - stopped_at)
    assert timing["device_s"] == pytest.approx(timing["torchrun_wall_s"] - timing["stopped_s"])  # one device
    print(json.dumps({"b_wall_s": round(b_wall_s, 1), "held_timing": timing}))


@pytest.mark.torchrun
def test_a_disk_full_between_a_measurement_and_its_record_stops_the_run_and_loses_nothing(tmp_path):
    """The disk fills while the driver holds the first point's measurement (the driver's test gate): the point is
    recorded in the room set aside for it before its launch, the next point stops the run in one line naming the path
    and the space left, and every file in the store is whole. With space again, the same command records the other
    points once, and measures none twice."""
    if ROOT_ONLY:
        pytest.skip(ROOT_ONLY)
    gates = tmp_path / "gates"
    gates.mkdir()
    for phase in GATE_PHASES:
        (gates / f"{phase}.go").touch()  # the ranks go through; the driver stops once measured
    with tmpfs(tmp_path / "disk", "1m") as disk:
        store = disk / "store"
        argv = [sys.executable, "-m", "scaling", "run", "-m", *GRID, f"sweep_dir={store}"]
        first = subprocess.Popen(
            argv, cwd=REPO, env={**os.environ, GATE_ENV: str(gates)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        with _ended(first):
            _wait_for(gates / "measured.reached", first)
            ballast = fill(disk)
            (gates / "measured.go").touch()
            out, err = (text.decode() for text in first.communicate(timeout=180))
        assert first.returncode == 1, out[-2000:] + err[-2000:]
        assert "Traceback" not in out + err, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert (
            last.startswith(f"scaling run: no space left writing {store}/")
            and f"KiB free of 1.0 MiB on {disk})" in last
        )
        measured, *rest = _keys()
        assert [r["job_key"] for r in iter_records(store)] == [measured]  # recorded whole, nothing lost
        for path in store.rglob("*.json"):
            json.loads(path.read_text())  # every file the run wrote is whole, or absent

        ballast.unlink()
        again = scaling("run", "-m", *GRID, f"sweep_dir={store}")
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        records = {r["job_key"]: r for r in iter_records(store)}
        assert sorted(records) == sorted([measured, *rest]) and {r["status"] for r in records.values()} == {"ok"}
        assert all(r["provenance"]["attempt"] == 1 and len(r["repeats"]) == 1 for r in records.values())
        named = {store / key / r["repeats"][0]["dir"] for key, r in records.items()}
        measurements = {p.parent for p in store.glob("*/launches/*/worker.json")}
        assert measurements == named, (measurements, named)  # each measurement is a record's, none made twice


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root`, with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_a_read_only_store_is_read_by_status_report_predict_and_a_rerun_and_a_run_that_would_write_stops(
    tmp_path, capsys
):
    if ROOT_ONLY:
        pytest.skip(ROOT_ONLY)
    sweep_file = tmp_path / "two_invalid.yaml"
    sweep_file.write_text(TWO_INVALID)
    store = tmp_path / "store"
    first = scaling("sweep", str(sweep_file), f"sweep_dir={store}")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    before = _tree(store)

    with read_only(store, tmp_path / "ro") as ro:
        assert main(["status", str(ro)]) == 0
        assert "done         2  2 invalid" in capsys.readouterr().out

        assert main(["report", str(ro), "--out", str(tmp_path / "elsewhere"), "--jobs", "1"]) == 0
        assert (tmp_path / "elsewhere" / "report.md").is_file()
        capsys.readouterr()
        assert main(["report", str(ro), "--jobs", "1"]) == 1
        err = capsys.readouterr().err
        assert f"scaling report: cannot write {ro / 'report'} (Read-only file system)" in err, err
        assert "pass --out DIR to write it elsewhere" in err and "Traceback" not in err

        assert main(["predict", "--sweep", str(sweep_file), f"sweep_dir={ro}"]) == 0
        assert "2 recorded (2 invalid)" in capsys.readouterr().out

        rerun = scaling("sweep", str(sweep_file), f"sweep_dir={ro}")
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
        assert "2 points already recorded (2 invalid): not launched again" in rerun.stdout
        assert f"sweep faults: 2 points: 2 invalid ({ro})" in rerun.stdout
        assert "Traceback" not in rerun.stderr and "Warning" not in rerun.stderr, rerun.stderr

        more = scaling("sweep", str(sweep_file), f"sweep_dir={ro}", "train.seq_len=600,700,800")
        assert more.returncode == 1, more.stdout[-2000:] + more.stderr[-2000:]
        assert more.stderr.strip().splitlines()[-1] == (
            f"scaling sweep: cannot write {ro / '.sweep.json.lock'} (Read-only file system): the store is read-only "
            "here: 1 point still to run, not run"
        ), more.stderr
    assert _tree(store) == before
