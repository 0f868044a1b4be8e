"""A sweep of 10,000 points: resume, `scaling status` and `scaling report` on a full record store, and the
driver's own cost per launched point.

Builds a sweep file over a grid of `--points` points (5 models x ZeRO 0-3 x dp 1-16 x mbs 1-16 x
`train.seed`, on H100s) and a synthetic record store of every point of it: records shaped as the engine
writes them (tests/helpers/records.py), each under the job key of its point, in every status (ok 70 %, oom 10 %,
predicted_oom 8 %, timeout 5 %, failed 4 %, invalid 3 %, by key). Then, each timed as a user runs it:

    resume   scaling sweep <grid> sweep_dir=<store>     every point answered by the store, none launched
    status   scaling status <store>
    report   scaling report <store>

and, on a fresh directory, a small real grid through `scaling sweep` (benchmarks/bench_sweep.py's measure):
driver time per launched point = (sweep wall - torchrun wall - driver start-up) / points.
Targets: resume of 10,000 recorded points < 30 s, their `scaling status` < 10 s; driver time per launched point <= 0.398 s (bench_sweep, before).

With `--slurm N` (root, Debian's slurmctld/slurmd/munge) it also starts the test SLURM cluster
(tests/helpers/slurm_cluster.py) and sends N stand-in points (tests/standin_app: the project's config and plugins,
a job that only writes its record) through hydra-submitit's own launcher and through `hydra/launcher=slurm`,
4 at a time: the driver's peak resident memory, the bytes each point leaves in the submitit folder, and the
wall time.

    python benchmarks/bench_scale.py [--points 10000] [--dir DIR] [--real-sweep demo] [--real-overrides ...] [--slurm 500]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_sweep import run_sweep, startup_s  # noqa: E402

from scaling.core.enums import Status  # noqa: E402
from scaling.engine.jobfiles import RESULT_FILE  # noqa: E402
from scaling.store.read import iter_records  # noqa: E402
from scaling.sweep.compose import sweep_file_grid  # noqa: E402
from scaling.sweep.grid import survey  # noqa: E402
from tests.helpers.records import make_record  # noqa: E402

BLOCK = 500
"""Points per value of train.seed: 5 models x 4 ZeRO stages x 5 dp x 5 mbs."""
SHARES = [
    (70, Status.OK),
    (80, Status.OOM),
    (88, Status.PREDICTED_OOM),
    (93, Status.TIMEOUT),
    (97, Status.FAILED),
    (100, Status.INVALID),
]
"""Status of a point by its job key modulo 100."""


def write_grid(root: Path, points: int) -> Path:
    """sweeps/scale.yaml under `root`: the grid of `points` points (a multiple of BLOCK)."""
    (root / "sweeps").mkdir(parents=True, exist_ok=True)
    path = root / "sweeps" / "scale.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        # {points} points for benchmarks/bench_scale.py: every one is in the synthetic record store.
        defaults:
          - config
          - override hardware: h100
          - _self_
        sweep: scale
        logger:
          name: none
        train:
          precision: bf16
          seq_len: 512
        hydra:
          mode: MULTIRUN
          sweeper:
            params:
              model: tiny,small,llama_1b,llama_3b,llama_8b
              parallel.zero_stage: 0,1,2,3
              parallel.dp: 1,2,4,8,16
              train.mbs: 1,2,4,8,16
              train.seed: range(0,{points // BLOCK})
        """)
    )
    return path


def write_store(sweep_file: Path, sweep_dir: Path) -> int:
    """A record for every point of the grid, in every status; returns how many."""
    n = 0
    with sweep_file_grid(sweep_file, [f"sweep_dir={sweep_dir}"]) as (points, configs):
        for point in survey(points, configs):
            status = next(s for bound, s in SHARES if int(point.key, 16) % 100 < bound)
            c = point.cfg
            record = make_record(
                status,
                model=c.model.name,
                seq_len=c.train.seq_len,
                mbs=c.train.mbs,
                dp=c.parallel.dp,
                zero_stage=c.parallel.zero_stage,
                sweep="scale",
            )
            record.update(job_key=point.key, config=c.experiment())
            (sweep_dir / point.key).mkdir(parents=True, exist_ok=True)
            (sweep_dir / point.key / RESULT_FILE).write_text(json.dumps(record))  # no fsync: 10,000 files
            n += 1
    return n


def timed(argv: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds and outcome of a `scaling` command."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "scaling", *argv], cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    return time.perf_counter() - t0, out


def slurm_footprint(root: Path, points: int) -> None:
    """Stand-in points through hydra-submitit's launcher and ours, on the test cluster: memory, bytes, wall."""
    from tests.helpers.slurm_cluster import SlurmCluster

    cluster = SlurmCluster(nodes=2)
    cluster.start()
    try:
        for launcher in ("submitit_slurm", "slurm"):
            sweep_dir = root / "runs" / f"slurm-{launcher}"
            argv = [
                sys.executable,
                str(REPO / "tests" / "standin_app" / "standin_app.py"),
                "-m",
                f"hydra/launcher={launcher}",
                f"train.seed=range(0,{points})",
                "logger=none",
                f"sweep_dir={sweep_dir}",
                "hydra.launcher.array_parallelism=4",
            ]
            t0 = time.perf_counter()
            driver = subprocess.Popen(
                argv, cwd=REPO, env=cluster.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            peak = 0
            while driver.poll() is None:
                try:
                    peak = max(peak, psutil.Process(driver.pid).memory_info().rss)
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.2)
            wall = time.perf_counter() - t0
            submitit = sweep_dir / ".submitit"
            files = [p for p in submitit.rglob("*") if p.is_file()]
            per_point = (
                sum(p.stat().st_size for p in files if p.name.endswith(("_submitted.pkl", "_result.pkl"))) / points
            )
            print(
                f"  SLURM, {points} stand-in points, hydra/launcher={launcher:<14} exit {driver.returncode}: "
                f"driver peak RSS {peak / 2**20:6.1f} MiB, {per_point / 1024:6.1f} KiB of pickles per point, "
                f"wall {wall:6.1f} s"
            )
    finally:
        cluster.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=10_000, help=f"grid size, a multiple of {BLOCK}")
    p.add_argument("--dir", type=Path, default=None, help="work folder (default: a new temporary one)")
    p.add_argument("--real-sweep", default="demo", help="the small real grid's sweep file")
    p.add_argument(
        "--real-overrides",
        nargs="*",
        default=["model=tiny", "train.seq_len=128"],
        help="overrides that make it small (default: the demo's 16 tiny points)",
    )
    p.add_argument(
        "--slurm",
        type=int,
        default=0,
        metavar="N",
        help="also send N stand-in points through both SLURM launchers on the test cluster (root)",
    )
    a = p.parse_args()
    if a.points < BLOCK or a.points % BLOCK:
        p.error(f"--points={a.points}: use a multiple of {BLOCK}")
    root = (a.dir or Path(tempfile.mkdtemp(prefix="bench_scale_"))).resolve()
    store = root / "runs" / "scale"

    t0 = time.perf_counter()
    n = write_store(write_grid(root, a.points), store)
    built = time.perf_counter() - t0
    statuses = {}
    for r in iter_records(store):
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    print(f"bench_scale: {n} points {statuses}; store built in {built:.1f} s ({store})")

    resume_s, out = timed(["sweep", "scale", f"sweep_dir={store}"], root)
    answered = re.search(r"\[(\d+)/(\d+)\] (\d+) points already recorded", out.stdout)
    if not answered or int(answered.group(3)) != n:  # (exit status 1: the store holds failed points)
        sys.exit(f"resume did not answer all {n} points from the store:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    status_s, out = timed(["status", str(store)], root)
    report_s, out = timed(["report", str(store)], root)
    if out.returncode != 0:
        sys.exit(f"scaling report failed:\n{out.stderr[-2000:]}")
    start = startup_s()
    print(
        f"  resume of {n} recorded points {resume_s:8.1f} s   ({resume_s / n * 1000:.2f} ms per point; target < 30 s)"
    )
    print(f"  scaling status           {status_s:8.1f} s   (target < 10 s)")
    print(f"  scaling report           {report_s:8.1f} s")

    real_dir = root / "runs" / "real"
    wall = run_sweep(a.real_sweep, real_dir, a.real_overrides)
    records = list(iter_records(real_dir))
    torchrun = sum(r["timing"].get("torchrun_wall_s") or 0.0 for r in records)
    per_point = (wall - torchrun - start) / max(1, len(records))
    print(
        f"  real grid {a.real_sweep} {' '.join(a.real_overrides)}: {len(records)} points, wall {wall:.1f} s, "
        f"in torchrun {torchrun:.1f} s, driver start-up {start:.2f} s"
    )
    print(f"  driver time per launched point {per_point:6.3f} s   (target <= 0.398)")
    if a.slurm:
        slurm_footprint(root, a.slurm)


if __name__ == "__main__":
    main()
