"""Memory predictors against real CPU runs: accuracy, OOM classification and speed.

    python benchmarks/bench_predictor.py [--sweep-dir /tmp/bench_predictor] [--quick]

Runs 44 real points (tiny and small models, seq_len 32-256, mbs 1-8, ZeRO 0-3, dp 1-2,
recompute none/full, a few bf16 and grad_acc=2) and 24 held-out points (two other shapes, one
tied, one without GQA, seq_len 48-160, bf16, recompute and grad_acc 2-3 mixed) through
`scaling.job.run.run_point` with the pre-screen off (records are reused on a rerun), and compares each measured peak
(`metrics.peak_mem_bytes`: torch's memory tracker, max over ranks) with the analytic and the
traced prediction. Prints per method the median and maximum relative error, in-sample and held out
apart (the analytic activation coefficients were read off tiny and small), the OOM
classification accuracy against an emulated capacity in the middle of the measured range (on CPU
a point runs out of memory exactly when the tracker's live bytes pass the capacity, so "measured
OOM" is measured peak > capacity), and the speed figures: analytic over 10,000 configs, traced
llama_8b at dp=512. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scaling.core.schema import HardwareConfig, ParallelConfig, TrainConfig  # noqa: E402
from scaling.job.run import run_point  # noqa: E402
from scaling.predictor.analytic import analytic_peak, predict_config  # noqa: E402
from scaling.predictor.prescreen import TRACE_BANDS  # noqa: E402
from scaling.predictor.trace import trace_peak  # noqa: E402
from scaling.sweep.compose import compose_config  # noqa: E402

SEQ_MBS = [(32, 4), (64, 2), (128, 1), (256, 2), (64, 8), (128, 4), (32, 1), (256, 1)]
HELD_OUT_MODELS = {
    # Shapes the analytic model's activation coefficients were never read off (those came from tiny and small).
    "tied": [
        "model.n_layers=3",
        "model.hidden=96",
        "model.n_heads=6",
        "model.n_kv_heads=2",
        "model.ffn_hidden=320",
        "model.vocab_size=1000",
        "model.tie_embeddings=true",
    ],
    "mha": [
        "model.n_layers=2",
        "model.hidden=80",
        "model.n_heads=5",
        "model.n_kv_heads=5",
        "model.ffn_hidden=224",
        "model.vocab_size=3000",
    ],
}


def held_out_points() -> list[list[str]]:
    """Other shapes, sequence lengths and micro-batches, with bf16, recompute and grad_acc > 1 mixed in."""
    grid = []
    combos = itertools.product(
        HELD_OUT_MODELS,
        (0, 1, 2, 3),
        ((48, 3, "fp32", "none", 1), (96, 2, "bf16", "full", 2), (160, 1, "bf16", "none", 3)),
    )
    for name, stage, (seq, mbs, precision, recompute, grad_acc) in combos:
        grid.append(
            [
                "model=small",
                *HELD_OUT_MODELS[name],
                f"train.seq_len={seq}",
                f"train.mbs={mbs}",
                f"parallel.zero_stage={stage}",
                f"parallel.dp={1 + stage % 2}",
                f"train.precision={precision}",
                f"train.recompute={recompute}",
                f"train.grad_acc={grad_acc}",
            ]
        )
    return grid


def points() -> list[list[str]]:
    """The benchmark grid: every (model, ZeRO stage, dp, recompute), seq_len and mbs cycling, plus bf16 and grad_acc=2."""
    grid = []
    combos = itertools.product(("tiny", "small"), (0, 1, 2, 3), (1, 2), ("none", "full"))
    for i, (model, stage, dp, recompute) in enumerate(combos):
        seq, mbs = SEQ_MBS[i % len(SEQ_MBS)]
        grid.append(
            [
                f"model={model}",
                f"train.seq_len={seq}",
                f"train.mbs={mbs}",
                f"parallel.zero_stage={stage}",
                f"parallel.dp={dp}",
                f"train.recompute={recompute}",
            ]
        )
    for stage, model in zip((0, 1, 2, 3, 0, 1, 2, 3), ("tiny",) * 4 + ("small",) * 4):
        grid.append(
            [
                f"model={model}",
                "train.seq_len=128",
                "train.mbs=2",
                f"parallel.zero_stage={stage}",
                "parallel.dp=2",
                "train.precision=bf16",
            ]
        )
    for stage in (0, 1, 2, 3):
        grid.append(
            [
                "model=small",
                "train.seq_len=64",
                "train.mbs=2",
                f"parallel.zero_stage={stage}",
                "parallel.dp=2",
                "train.grad_acc=2",
            ]
        )
    return grid


def rel(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def accuracy(rows: list[dict], capacity: float) -> dict[str, float]:
    """Fraction of points whose predicted fit/OOM at `capacity` agrees with the measured one, per method;
    `pre-screen` is the pre-screen's rule: analytic, traced where analytic / capacity is in the CPU's band."""
    low, high = TRACE_BANDS["cpu"]

    def prescreen(r: dict) -> float:
        return r["traced"] if low <= r["analytic"] / capacity <= high else r["analytic"]

    methods = {"analytic": lambda r: r["analytic"], "traced": lambda r: r["traced"], "pre-screen": prescreen}
    return {
        m: sum((f(r) > capacity) == (r["measured"] > capacity) for r in rows) / len(rows) for m, f in methods.items()
    }


def speed_analytic(n: int = 10_000) -> float:
    """Seconds for `n` analytic predictions over random models and settings."""
    rng = random.Random(0)
    models = [
        compose_config([f"model={m}"]).model for m in ("tiny", "small", "llama_1b", "llama_3b", "llama_8b", "llama_70b")
    ]
    configs = [
        (
            rng.choice(models),
            rng.choice((512, 2048, 8192)),
            rng.choice((1, 2, 4, 8)),
            rng.choice((1, 8, 64, 512)),
            rng.randrange(4),
            rng.choice(("fp32", "bf16")),
            rng.choice(("none", "full")),
            rng.choice((1, 4)),
        )
        for _ in range(n)
    ]
    typed = [
        (
            model,
            TrainConfig(seq_len=seq, mbs=mbs, precision=precision, recompute=recompute),
            ParallelConfig(dp=dp, zero_stage=stage),
            HardwareConfig(),
            grad_acc,
        )
        for model, seq, mbs, dp, stage, precision, recompute, grad_acc in configs
    ]
    t0 = time.perf_counter()
    for c in typed:
        analytic_peak(*c)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep-dir", default="/tmp/bench_predictor")
    p.add_argument("--quick", action="store_true", help="the first 8 points only")
    a = p.parse_args()
    grid = [(o, False) for o in (points()[:8] if a.quick else points())]
    grid += [(o, True) for o in (held_out_points()[:4] if a.quick else held_out_points())]
    base = [
        "train.warmup_steps=1",
        "train.steps=1",
        "launch.prescreen=false",
        "launch.reuse=true",  # the tracked bytes are the same on warm ranks (bench_reuse.py)
        "launch.timeout_s=600",
        "sweep=bench_predictor",
        f"sweep_dir={a.sweep_dir}",
    ]
    rows = []
    print(f"{len(grid)} real points (records in {a.sweep_dir}; rerun reuses them)")
    print(f"{'point':<92} {'measured':>10} {'analytic':>9} {'traced':>8}  phase")
    for overrides, held_out in grid:
        cfg = compose_config(base + overrides)
        rec = run_point(cfg)
        if rec["status"] != "ok":
            print(f"{' '.join(overrides):<92} {rec['status']}: {rec['error']}")
            continue
        measured = rec["metrics"]["peak_mem_bytes"]
        analytic = predict_config(cfg)
        traced = trace_peak(cfg)
        name = next((n for n, o in HELD_OUT_MODELS.items() if o[0] in overrides), None)
        shown = [f"model={name}"] + [o for o in overrides if not o.startswith("model")] if name else overrides
        row = {
            "point": " ".join(o.split(".")[-1] for o in shown),
            "stage": cfg.parallel.zero_stage,
            "measured": measured,
            "analytic": analytic.total_bytes,
            "traced": traced.peak_mem_bytes,
            "held_out": held_out,
        }
        rows.append(row)
        print(
            f"{row['point']:<92} {measured:>10} {rel(row['analytic'], measured):>+9.3f} {rel(row['traced'], measured):>+8.3f}"
            f"  {analytic.phase}",
            flush=True,
        )
    if not rows:
        return
    for held_out, label in (
        (False, "in-sample: tiny and small, the shapes the analytic coefficients were read off"),
        (True, "held out: other shapes, bf16, recompute and grad_acc > 1 mixed"),
    ):
        part = [r for r in rows if r["held_out"] == held_out]
        if not part:
            continue
        print(f"\nrelative error of predicted vs measured peak bytes per rank, {label} ({len(part)} points):")
        for method in ("traced", "analytic"):
            errs = [abs(rel(r[method], r["measured"])) for r in part]
            print(f"  {method:<9} median {100 * statistics.median(errs):6.2f}%   max {100 * max(errs):6.2f}%")
            for stage in range(4):
                se = [abs(rel(r[method], r["measured"])) for r in part if r["stage"] == stage]
                if se:
                    print(
                        f"      ZeRO-{stage}: median {100 * statistics.median(se):6.2f}%   max {100 * max(se):6.2f}%  (n={len(se)})"
                    )
    print(
        "(on CPU the measurement is torch's tracker of live tensor bytes, the instrument the traced predictor "
        "uses too: traced = measured shows the trace reproduces the tracker, not a device; see "
        "benchmarks/gpu/ for the analytic model against a GPU's max_memory_allocated)"
    )
    measured = sorted(r["measured"] for r in rows)
    for label, capacity in (
        ("median of measured peaks", statistics.median(measured)),
        ("midpoint of measured range", (measured[0] + measured[-1]) / 2),
    ):
        acc = accuracy(rows, capacity)
        n_oom = sum(r["measured"] > capacity for r in rows)
        print(
            f"OOM classification at capacity {capacity / 2**20:.2f} MiB ({label}; {n_oom}/{len(rows)} measured OOM): "
            + ", ".join(f"{m} {100 * v:.1f}%" for m, v in acc.items())
        )

    print(f"\nspeed: analytic over 10,000 configs: {speed_analytic():.3f} s")
    for stage in (3, 2, 1, 0):
        cfg = compose_config(
            [
                "model=llama_8b",
                "hardware=h100",
                "train.precision=bf16",
                "train.seq_len=4096",
                "train.mbs=1",
                "parallel.dp=512",
                f"parallel.zero_stage={stage}",
            ]
        )
        t0 = time.perf_counter()
        tr = trace_peak(cfg)
        print(
            f"speed: traced llama_8b seq_len=4096 mbs=1 bf16 dp=512 ZeRO-{stage}: {time.perf_counter() - t0:.1f} s in process "
            f"(peak {tr.peak_mem_bytes / 2**30:.1f} GiB per rank; analytic {predict_config(cfg).total_bytes / 2**30:.1f} GiB)"
        )
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scaling.cli.predict",
            "--json",
            "model=llama_8b",
            "hardware=h100",
            "train.precision=bf16",
            "train.seq_len=4096",
            "train.mbs=1",
            "parallel.dp=512",
            "parallel.zero_stage=3",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    print(
        f"speed: `scaling predict` for the same ZeRO-3 point from a cold interpreter (imports, both methods): "
        f"{time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
