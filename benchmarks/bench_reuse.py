"""Warm ranks against fresh launches, side by side in one run (launch.reuse, scaling.launch.warm).

Part 1, per point: the same points (tiny model, dp=2, ZeRO 0-3, seq_len 128, mbs 2) run `--rounds` times as fresh
launches and as turns of one warm job, rounds interleaved so both see the same machine. Per point it prints
tokens/s per GPU (median [min-max] over the rounds) fresh and warm and their ratio, whether the tracked peak bytes
of every rank and the losses are equal (where the peaks are not, the distinct per-rank peaks fresh and warm: at
ZeRO-1 to 3 gloo's worker thread frees a finished collective's buffers at its own time, so fresh launches differ
among themselves), and the seconds each point held its devices.

Part 2 (`--sweep NAME`, e.g. demo): the named sweep run as a user would, once with launch.reuse=false and once
with launch.reuse=true, in fresh directories: sweep wall time, device time held and its share in timed steps,
driver time per point.

    python benchmarks/bench_reuse.py [--rounds 3] [--sweep demo]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scaling.job.run import run_point  # noqa: E402
from scaling.launch import warm  # noqa: E402
from scaling.store.device_time import total  # noqa: E402
from scaling.store.read import iter_records  # noqa: E402
from tests.helpers.compose import compose_point  # noqa: E402

COMMON = ["logger=none", "model=tiny", "train.seq_len=128", "train.mbs=2", "parallel.dp=2", "train.steps=8"]
POINTS = {f"zero{stage}": [f"parallel.zero_stage={stage}"] for stage in range(4)}


def band(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} [{min(values):7.1f}-{max(values):7.1f}]"


def per_point(rounds: int, root: Path) -> None:
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(rounds):
        for mode, reuse in (("fresh", "false"), ("warm", "true")):
            store = root / f"{mode}{r}"
            for name, overrides in POINTS.items():
                cfg = compose_point([*COMMON, *overrides, f"launch.reuse={reuse}"], store)
                runs.setdefault((name, mode), []).append(run_point(cfg))
            warm.close()
    print(f"bench_reuse: {rounds} rounds, fresh and warm interleaved; {' '.join(COMMON)}")
    print(
        "  point  tokens/s/GPU fresh (median [min-max])  warm                     warm/fresh  "
        "peak bytes equal  losses equal  held s fresh  warm"
    )
    for name in POINTS:
        fresh, warm_runs = runs[(name, "fresh")], runs[(name, "warm")]
        bad = [r for r in fresh + warm_runs if r["status"] != "ok"]
        if bad:
            print(f"  {name}: not ok: {[r['error'] for r in bad]}")
            continue
        tf = [r["metrics"]["tokens_per_s_per_gpu"] for r in fresh]
        tw = [r["metrics"]["tokens_per_s_per_gpu"] for r in warm_runs]
        peaks_f = {p for r in fresh for p in r["metrics"]["peak_mem_bytes_per_rank"]}
        peaks_w = {p for r in warm_runs for p in r["metrics"]["peak_mem_bytes_per_rank"]}
        peaks = "yes" if len(peaks_f | peaks_w) == 1 else f"fresh {sorted(peaks_f)} warm {sorted(peaks_w)}"
        losses = {tuple(r["metrics"]["losses"]) for r in fresh + warm_runs}
        held_f = statistics.median(r["timing"]["torchrun_wall_s"] for r in fresh)
        held_w = statistics.median(r["timing"]["torchrun_wall_s"] for r in warm_runs)
        turns = sorted({r["repeats"][0]["timing"]["points_before"] for r in warm_runs})
        print(
            f"  {name:6} {band(tf)}        {band(tw)}    {statistics.median(tw) / statistics.median(tf):5.2f}"
            f"       {peaks:16}  {'yes' if len(losses) == 1 else 'NO':12}"
            f"  {held_f:6.2f}       {held_w:5.2f}   (warm turn {turns})"
        )


def sweep(name: str, root: Path) -> None:
    print(f"bench_reuse: sweep {name}, launch.reuse=false then true")
    for reuse in ("false", "true"):
        sweep_dir = root / f"{name}-reuse-{reuse}"
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "scaling", "sweep", name, f"sweep_dir={sweep_dir}", f"launch.reuse={reuse}"],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - t0
        records = list(iter_records(sweep_dir))
        in_torchrun = sum(r["timing"].get("torchrun_wall_s") or 0.0 for r in records)
        statuses = {s: sum(r["status"] == s for r in records) for s in sorted({r["status"] for r in records})}
        print(f"  reuse={reuse:5}  wall {wall:7.1f} s  {len(records)} points {statuses}")
        print(f"    device time {total(r.get('timing') or {} for r in records).held()}")
        print(f"    driver time per point (wall - in torchrun) / points: {(wall - in_torchrun) / len(records):.3f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sweep", default=None, help="also run this named sweep fresh and warm (e.g. demo)")
    p.add_argument("--skip-points", action="store_true", help="only the sweep")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_reuse_"))
    if not a.skip_points:
        per_point(a.rounds, root)
    if a.sweep:
        sweep(a.sweep, root)


if __name__ == "__main__":
    main()
