"""A Hugging Face config planned by the calibrated predictor against the trace of every point, side by side in one run
(scaling.predictor.calibrated; `scaling recipe model=hf_qwen3_8b hardware=h100 train.precision=bf16
train.seq_len=4096 --gbs-tokens 4Mi --gpus 8,64,256`).

Part 1, the plan's memory: the candidates' largest mbs per count (scaling.recipe.candidates.find_candidates, every
ZeRO stage and recompute setting, the hybrid and tensor-parallel layouts) found with the calibrated predictor from
an empty directory, timed, and the distinct points it asked for counted; each of them is one whole-model trace on the
slow path, timed on a sample (`--sample`) and multiplied out: an extrapolation, not a run of the slow path. The
built-in llama_8b's same search (analytic) is timed beside it.

Part 2, the rows: each row of a recipe.json (`--recipe`, that command's answer) traced whole at its mbs and at
mbs + 1: the calibrated figure beside the trace, and whether the trace too takes that mbs as the largest that fits.

    python benchmarks/bench_plan_fast.py [--model hf_qwen3_8b --builtin llama_8b] [--sample 4]
        [--recipe runs/recipe/recipe.json [--rows-only]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scaling.core.layout import Layout  # noqa: E402
from scaling.predictor import calibrated  # noqa: E402
from scaling.predictor.prescreen import capacity_bytes  # noqa: E402
from scaling.predictor.trace import trace_peak  # noqa: E402
from scaling.recipe.candidates import find_candidates, point_config  # noqa: E402
from scaling.sweep.compose import compose_config  # noqa: E402

COMMON = ["hardware=h100", "train.precision=bf16", "train.seq_len=4096", "logger=none"]
GPUS = [8, 64, 256]
GIB = 2**30


def plan(model: str, where: str) -> tuple[float, list, list]:
    """find_candidates from an empty directory: its wall time, the candidates and the distinct points asked for."""
    cfg = compose_config([f"model={model}", *COMMON])
    asked: dict[str, object] = {}
    predicted_peak = calibrated.predicted_peak

    def counting(point, grad_acc, kept_in=None):
        asked[json.dumps(point.to_dict(), sort_keys=True, default=str)] = point
        return predicted_peak(point, grad_acc, kept_in)

    calibrated.predicted_peak = counting
    calibrated._CALIBRATIONS.clear()
    t0 = time.perf_counter()
    try:
        found = find_candidates(cfg, [0, 1, 2, 3], ["none", "selective", "full"], GPUS, 1024, 0, None, Path(where), [])
    finally:
        calibrated.predicted_peak = predicted_peak
    return time.perf_counter() - t0, found, list(asked.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=4, help="whole-model traces timed for the slow path's extrapolation")
    p.add_argument("--model", default="hf_qwen3_8b", help="the Hugging Face config's model file (conf/model)")
    p.add_argument("--builtin", default="llama_8b", help="the built-in preset whose analytic search is timed beside")
    p.add_argument("--recipe", default=None, help="a recipe.json of --model whose rows to trace whole")
    p.add_argument("--rows-only", action="store_true", help="part 2 alone")
    a = p.parse_args()
    if a.rows_only:
        rows(a.model, json.loads(Path(a.recipe).read_text()))
        return
    print(f"load average at start: {os.getloadavg()}", flush=True)
    compose_config([f"model={a.model}", *COMMON])  # imports, outside the timings
    with tempfile.TemporaryDirectory() as d:
        fast_s, found, points = plan(a.model, d)
        calibrations = len(list((Path(d) / "traces" / "calibrations").glob("*.json")))
    with tempfile.TemporaryDirectory() as d:
        builtin_s, _, _ = plan(a.builtin, d)
    print(
        f"\nPart 1. {a.model}, every stage and recompute setting, counts {GPUS}: {len(found)} candidates from "
        f"{len(points)} distinct points; calibrated: {fast_s:.1f} s ({calibrations} settings calibrated); the "
        f"built-in {a.builtin}'s same search (analytic): {builtin_s:.1f} s",
        flush=True,
    )
    step = max(1, len(points) // a.sample)
    sample = points[::step][: a.sample]
    walls, errors = [], []
    for point in sample:
        t0 = time.perf_counter()
        traced = trace_peak(point).peak_mem_bytes
        walls.append(time.perf_counter() - t0)
        fast = calibrated.predicted_peak(point, int(point.train.grad_acc))
        errors.append(fast / traced - 1)
        layout = point.parallel.layout
        print(
            f"  {layout.name} recompute {point.train.recompute} at {layout.world_size} GPUs mbs {point.train.mbs}: "
            f"traced {traced / GIB:.3f} GiB in {walls[-1]:.1f} s, calibrated {fast / GIB:.3f} GiB ({errors[-1]:+.2%})",
            flush=True,
        )
    mean, spread = statistics.mean(walls), (min(walls), max(walls))
    print(
        f"  slow path, extrapolated: {len(points)} points x {mean:.1f} s a trace [{spread[0]:.1f}-{spread[1]:.1f}] = "
        f"{len(points) * mean / 60:.0f} min (the rows' own points not counted); calibrated {fast_s:.1f} s: "
        f"{len(points) * mean / fast_s:.0f}x faster; calibrated / trace on the sample: "
        f"{min(errors):+.2%} to {max(errors):+.2%}",
        flush=True,
    )
    if a.recipe:
        rows(a.model, json.loads(Path(a.recipe).read_text()))


def rows(model: str, recipe: dict) -> None:
    """Each row traced whole at its mbs and one more: the same largest mbs as the slow path's?"""
    cfg = compose_config([f"model={model}", *COMMON])
    capacity = capacity_bytes(cfg.hardware)
    gbs = int(recipe["gbs_samples_target"])
    print(f"\nPart 2. the rows of {recipe['model']} (capacity {capacity / GIB:.2f} GiB, margin per row)")
    for row in recipe["rows"]:
        if row.get("mbs") is None:
            continue
        layout = Layout(row["zero_stage"], row["dp"], row.get("dp_shard"), tp=row.get("tp") or 1)
        grad_acc = 2 if gbs // layout.dp > 1 else 1
        limit = capacity / (1 + (row.get("margin_frac") or 0.0))
        said = []
        for mbs in (row["mbs"], row["mbs"] + 1):
            point = point_config(cfg, layout, row["recompute"], mbs, grad_acc)
            traced = trace_peak(point).peak_mem_bytes
            fast = calibrated.predicted_peak(point, grad_acc)
            said.append(
                f"mbs {mbs}: traced {traced / GIB:.2f}, calibrated {fast / GIB:.2f} GiB ({fast / traced - 1:+.2%}), "
                f"trace {'fits' if traced <= limit else 'does not fit'}"
            )
        print(f"  {row['gpus']} GPUs, {layout.name} recompute {row['recompute']}: " + "; ".join(said), flush=True)


if __name__ == "__main__":
    main()
