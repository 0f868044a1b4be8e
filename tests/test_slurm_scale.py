"""Sweeps on the test SLURM cluster through `hydra/launcher=slurm` (hydra_plugins/scaling_slurm_launcher), with
stand-in points (tests/standin_app: the project's config, sweeper, launcher and callback; a job that only writes
its record): points in throttled job arrays with their progress printed by the driver, and a re-run while the
array is still queued or running (its first task held at the test gate), which leaves the in-flight points to
their SLURM jobs. A real point under SLURM is tested in test_slurm.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaling.engine.jobfiles import RESULT_FILE
from scaling.engine.lifetime import GATE_ENV
from tests.helpers.compose import REPO

STANDIN = REPO / "tests" / "standin_app" / "standin_app.py"


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900, **kw)


def status(sweep_dir: Path) -> dict:
    out = run([sys.executable, "-m", "scaling", "status", str(sweep_dir), "--json"])
    return json.loads(out.stdout) if out.returncode == 0 else {}


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals that overlap."""
    now = best = 0
    for _, step in sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals]):
        now += step
        best = max(best, now)
    return best


@pytest.mark.slurm
def test_points_go_out_in_throttled_arrays_and_report_in_the_driver(slurm_cluster, tmp_path):
    """What is tested is the submission in arrays, the throttle and the progress, not the number of points."""
    sweep_dir = tmp_path / "runs"
    n, chunk, at_once = 12, 5, 3  # 500 points ran through both launchers in benchmarks/bench_scale.py --slurm 500
    args = [
        sys.executable,
        str(STANDIN),
        "-m",
        "hydra/launcher=slurm",
        f"train.seed=range(0,{n})",
        "logger=none",
        f"sweep_dir={sweep_dir}",
        f"hydra.launcher.array_chunk={chunk}",
        f"hydra.launcher.array_parallelism={at_once}",
    ]
    out = run(args)
    assert out.returncode == 0, out.stderr[-3000:]

    # The driver prints every point's line as its task ends, numbered in order, each once.
    lines = [m for m in map(re.compile(rf"^\[(\d+)/{n}\] ([0-9a-f]{{12}}) ok ").match, out.stdout.splitlines()) if m]
    assert [int(m.group(1)) for m in lines] == list(range(1, n + 1))
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{RESULT_FILE}")]
    assert sorted(m.group(2) for m in lines) == sorted(r["job_key"] for r in records) and len(records) == n
    assert out.stdout.splitlines()[-1] == f"sweep adhoc: {n} points: {n} ok ({sweep_dir})"

    # Arrays of at most `chunk` points; never more than `at_once` points running, from at most two arrays.
    tasks = [(r["timing"]["t0"], r["timing"]["t1"], r["env"]["slurm_job_id"].split("_")[0]) for r in records]
    arrays = sorted({a for _, _, a in tasks}, key=int)
    assert [sum(a == b for *_, b in tasks) for a in arrays] == [5, 5, 2]
    assert 2 <= most_at_once([(t0, t1) for t0, t1, _ in tasks]) <= at_once
    for t0, _, _ in tasks:
        assert len({a for s, e, a in tasks if s <= t0 <= e}) <= 2
    # One small submission file per point (its overrides and number); the launcher's state once per launch.
    submitted = list((sweep_dir / ".submitit").glob("*/*_submitted.pkl"))
    assert len(submitted) == n and max(p.stat().st_size for p in submitted) < 2048
    assert list((sweep_dir / ".submitit").glob("launcher-*.pkl")) == []  # removed once every point has ended

    again = run(args)
    assert (
        again.returncode == 0 and f"[{n}/{n}] {n} points already recorded ({n} ok): not launched again" in again.stdout
    )
    assert len(list((sweep_dir / ".submitit").glob("*/*_submitted.pkl"))) == n  # nothing submitted
    assert status(sweep_dir)["done"] == {"ok": n}


@pytest.mark.slurm
def test_a_rerun_while_the_array_is_in_flight_leaves_its_points_to_their_slurm_jobs(slurm_cluster, tmp_path):
    sweep_dir, gates = tmp_path / "runs", tmp_path / "gates"
    gates.mkdir()
    args = [
        sys.executable,
        str(STANDIN),
        "-m",
        "hydra/launcher=slurm",
        "hydra.launcher.array_parallelism=1",
        "logger=none",
        "parallel.zero_stage=0,1,2",
        f"sweep_dir={sweep_dir}",
    ]
    first_out = tmp_path / "first.out"
    with first_out.open("w") as f:  # its tasks stop at the gate: the array stays in flight until released
        first = subprocess.Popen(
            args,
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, GATE_ENV: str(gates)},
        )
    try:
        deadline = time.monotonic() + 120
        while not list(gates.glob("*.reached")) or not (seen := status(sweep_dir)) or len(seen["in_flight"]) < 3:
            assert time.monotonic() < deadline and first.poll() is None, first_out.read_text()[-3000:]
            time.sleep(0.2)
        held = sorted(f["slurm_job_id"] for f in seen["in_flight"])
        assert sorted(f["state"] for f in seen["in_flight"]) == ["queued", "queued", "running"]
        assert all("_" in j for j in held)

        second = run(args)
        assert second.returncode == 0, second.stderr[-3000:]
        in_flight = re.search(r"(\d+) points in flight in other jobs \((.*)\): not launched again", second.stdout)
        assert in_flight, second.stdout
        assert set(re.findall(r"SLURM job (\d+_\d+)", in_flight.group(2))) <= set(held)
        assert "still in flight (scaling status" in second.stdout.splitlines()[-1]
    finally:
        for num in range(3):  # the held tasks go on, whatever happened above
            (gates / f"job{num}.go").touch()
    try:
        assert first.wait(timeout=600) == 0, first_out.read_text()[-3000:]
    finally:
        first.kill()

    # Each point ran once, in the array the first run submitted; its progress lines are in the first run's output.
    assert len(list((sweep_dir / ".submitit").glob("*/*_submitted.pkl"))) == 3
    records = [json.loads(p.read_text()) for p in sweep_dir.glob(f"*/{RESULT_FILE}")]
    assert [r["status"] for r in records] == ["ok"] * 3
    printed = re.findall(r"^\[(\d)/3\] ([0-9a-f]{12}) ok ", first_out.read_text(), re.M)
    assert [k for k, _ in printed] == ["1", "2", "3"] and {key for _, key in printed} == {r["job_key"] for r in records}
    assert list(sweep_dir.glob("*/running.json")) == []
