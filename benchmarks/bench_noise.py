"""Noise of a throughput measurement: within a run, in its first timed steps, and from launch to launch.

Each point (default: tiny and small x dp 1 and 2 x ZeRO 0 and 2, seq 128, mbs 4, fp32) runs with
`launch.repeats=--repeats` (a fresh torchrun per launch), `--warmup` warm-up and `--steps` timed steps.
The spread is the project's one statistic, the relative half-range (max - min) / (2 · median). Per point:

- within-run spread: of the timed steps after the suggested warm-up, median over launches;
- first timed steps: step i / median of the launch's second half, the largest over launches, i = 1..4;
- estimate error of n timed steps: |median of the first n / median of all - 1|, largest over launches;
- repeat-to-repeat spread: of the launches' tokens/s per GPU.

Then the defaults those figures suggest: the warm-up steps after which a timed step lies within the
within-run band of the steady state, the fewest timed steps whose median lies within a quarter of that
band of the median of all (and at most 1%), and whether a point needs repeats (launch-to-launch spread
above the within-run spread). Timing figures: run it on a quiet machine.

    python benchmarks/bench_noise.py [--repeats 5] [--warmup 2] [--steps 12] [--seq 128] [--mbs 4]
                                     [--points tiny:1:0,tiny:1:2,tiny:2:0,tiny:2:2,small:1:0,small:1:2,small:2:0,small:2:2]
                                     [overrides ...]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from scaling.core.host import usable_cores  # noqa: E402
from scaling.core.noise import relative_spread  # noqa: E402
from scaling.job.run import run_point  # noqa: E402
from tests.helpers.compose import compose_point  # noqa: E402

DEFAULT_POINTS = ",".join(f"{m}:{dp}:{z}" for m, dp, z in itertools.product(("tiny", "small"), (1, 2), (0, 2)))
FIRST_STEPS = 4
"""Timed steps looked at one by one for left-over warm-up."""


@dataclass
class PointNoise:
    """What the launches of one point say about its noise."""

    name: str
    launches: list[list[float]]
    """Each launch's timed step times, in order."""
    tokens_per_s_per_gpu: list[float]

    def first_step_ratios(self) -> list[float]:
        """Step i / median of the second half, the largest over launches, for the first FIRST_STEPS steps."""
        out = []
        for i in range(min(FIRST_STEPS, min(len(t) for t in self.launches))):
            out.append(max(t[i] / statistics.median(t[len(t) // 2 :]) for t in self.launches))
        return out

    def within_run_spread(self, skip: int) -> float:
        """Median over launches of the spread of the timed steps after `skip` more warm-up steps."""
        return statistics.median(relative_spread(t[skip:]) for t in self.launches)

    def estimate_errors(self, skip: int) -> dict[int, float]:
        """n -> largest |median(first n after skip) / median(all after skip) - 1| over launches."""
        steady = [t[skip:] for t in self.launches]
        return {
            n: max(abs(statistics.median(t[:n]) / statistics.median(t) - 1.0) for t in steady)
            for n in range(1, min(len(t) for t in steady) + 1)
        }

    def repeat_spread(self) -> float:
        """Spread of the launches' tokens/s per GPU."""
        return relative_spread(self.tokens_per_s_per_gpu)


def measure(point: str, a: argparse.Namespace, work: Path) -> PointNoise:
    """Launch one `model:dp:zero` point `--repeats` times and read its record."""
    model, dp, zero = point.split(":")
    overrides = [
        f"model={model}",
        f"train.seq_len={a.seq}",
        f"train.mbs={a.mbs}",
        "train.grad_acc=1",
        f"parallel.dp={dp}",
        f"parallel.zero_stage={zero}",
        f"train.warmup_steps={a.warmup}",
        f"train.steps={a.steps}",
        f"launch.repeats={a.repeats}",
        "launch.rerun=all",
        "logger=none",
        *a.overrides,
    ]
    record = run_point(compose_point(overrides, work / "runs"))
    if record["status"] != "ok":
        raise SystemExit(f"bench_noise: {point} ended {record['status']}: {record['error']}")
    launches = [r["metrics"] for r in record["repeats"]]
    return PointNoise(
        f"{model} dp={dp} ZeRO-{zero}",
        [m["step_times_s"] for m in launches],
        [m["tokens_per_s_per_gpu"] for m in launches],
    )


def suggest_skip(points: list[PointNoise]) -> int:
    """Extra warm-up steps after which every point's next timed step lies within its within-run band."""
    skip = 0
    for p in points:
        band = p.within_run_spread(FIRST_STEPS)
        ratios = p.first_step_ratios()
        skip = max(skip, next((i for i, r in enumerate(ratios) if r <= 1.0 + band), len(ratios)))
    return skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mbs", type=int, default=4)
    p.add_argument("--points", default=DEFAULT_POINTS, help="model:dp:zero_stage, comma-separated")
    p.add_argument("overrides", nargs="*", help="further Hydra overrides of every point")
    a = p.parse_args()
    if a.repeats < 2 or a.steps < 2 * FIRST_STEPS:
        p.error(
            f"--repeats={a.repeats} must be >= 2 and --steps={a.steps} >= {2 * FIRST_STEPS}: a spread needs "
            "several launches, and the first timed steps a steady second half to compare with"
        )
    work = Path(tempfile.mkdtemp(prefix="bench_noise_"))
    print(
        f"bench_noise: seq {a.seq}, mbs {a.mbs}, fp32, {a.warmup} warm-up + {a.steps} timed steps, {a.repeats} "
        f"launches per point, host {os.uname().nodename} ({usable_cores()} cores) {' '.join(a.overrides)}; "
        "spread = (max - min) / (2 · median)",
        flush=True,
    )
    points = []
    for point in a.points.split(","):
        points.append(measure(point, a, work))
        print(
            f"  measured {points[-1].name}: step times per launch "
            f"{[[round(t, 4) for t in launch] for launch in points[-1].launches]}",
            flush=True,
        )
    skip = suggest_skip(points)

    head = " ".join(f"step{i + 1}/med" for i in range(FIRST_STEPS))
    print(f"  {'point':<18} {head}  within-run  repeat-to-repeat  tokens/s/GPU per launch")
    for pt in points:
        ratios = " ".join(f"{r:9.2f}" for r in pt.first_step_ratios())
        within, across = f"±{pt.within_run_spread(skip):.1%}", f"±{pt.repeat_spread():.1%}"
        print(f"  {pt.name:<18} {ratios}  {within:>10}  {across:>16}  {[round(v) for v in pt.tokens_per_s_per_gpu]}")
    errors = [pt.estimate_errors(skip) for pt in points]
    ns = sorted(set.intersection(*(set(e) for e in errors)))
    worst = {n: max(e[n] for e in errors) for n in ns}
    print(f"  estimate error of the median of n timed steps (after {a.warmup} + {skip} warm-up), largest over points:")
    print("    " + "  ".join(f"n={n}: {worst[n]:.1%}" for n in ns))
    within = statistics.median(pt.within_run_spread(skip) for pt in points)
    across = statistics.median(pt.repeat_spread() for pt in points)
    target = min(0.01, within / 4)
    steps = next((n for n in ns if all(worst[m] <= target for m in ns if m >= n)), ns[-1])
    print(
        f"  median within-run spread ±{within:.1%}, repeat-to-repeat ±{across:.1%} "
        f"({across / within if within else float('inf'):.1f}x)"
    )
    print(
        f"  suggests: train.warmup_steps={a.warmup + skip}, train.steps={steps} (median within {target:.1%} of "
        f"all {ns[-1]}), "
        + (
            "launch.repeats>=3 (launches differ more than steps within one)"
            if across > within
            else "launch.repeats=1 (launches agree within a run's spread)"
        )
    )


if __name__ == "__main__":
    main()
