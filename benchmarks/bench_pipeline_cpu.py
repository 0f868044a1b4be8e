"""Pipeline stages on CPU: the bubble measured beside `scaling.perf.pipeline.bubble_fraction`, and each stage's peak.

    python benchmarks/bench_pipeline_cpu.py [--repeats 3] [--microbatches 1,2,4,8]

One rank (one pinned thread) stands for one GPU. A ~3.5M-parameter built-in decoder of 4 blocks runs on one rank
(pp=1) and on two (pp=2: blocks 0-1 with the embedding, blocks 2-3 with the norm and head, the split
`Family.stages` makes) at the same micro-batches (grad_acc m of mbs 2), GPipe at every m and 1F1B where it runs
(m >= pp), the launches alternating `--repeats` times on warm ranks. The bubble is measured two ways: in the run,
each stage's idle share of the schedule's time over the timed steps (`metrics.pipeline_idle_frac_per_rank`: the
time its rank was not inside a micro-batch's forward or backward: waits on the other stage and the sends; the
optimizer's step is outside it), and across runs, 1 - T1 × (costliest stage's share of the FLOPs per token) / Tpp
(T1, Tpp: median timed steps of the same repeat; the optimizer's step and the sends count as bubble there, and two
launches' load). Each stage's peak is the memory tracker's (live tensor bytes) on its rank. Prints Markdown;
asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from scaling.core.enums import PipelineSchedule
from scaling.job.run import run_point
from scaling.model.family import family_of
from scaling.perf.pipeline import bubble_fraction
from scaling.sweep.compose import compose_config

MODEL = [
    "model=tiny",
    "model.hidden=256",
    "model.n_heads=4",
    "model.n_kv_heads=4",
    "model.ffn_hidden=688",
    "model.n_layers=4",
]
SEQ, MBS = 128, 2
POINT = [
    *MODEL,
    "logger=none",
    f"train.seq_len={SEQ}",
    f"train.mbs={MBS}",
    "train.precision=fp32",
    "train.warmup_steps=2",
    "train.steps=8",
    "hardware.threads_per_device=1",
    "launch.timeout_s=600",
    "launch.reuse=true",
    "launch.reuse_idle_s=120",
]


def measure(store: Path, overrides: list[str]) -> dict:
    """The record of one point (its own launch: the store is the repeat's)."""
    record = run_point(compose_config([*POINT, *overrides, f"sweep_dir={store}"]))
    if record["status"] != "ok":
        raise RuntimeError(f"{overrides}: {record['status']}: {record['error']}")
    return record


def costliest_share(pp: int) -> tuple[float, list[range]]:
    """The costliest stage's share of the model's FLOPs per token, and the split."""
    family = family_of(compose_config(POINT).model)
    blocks, first, last = family.stage_costs(SEQ)
    split = family.stages(SEQ, pp)
    costs = [sum(blocks[i] for i in r) for r in split]
    costs[0] += first
    costs[-1] += last
    return max(costs) / sum(costs), split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--microbatches", default="1,2,4,8")
    args = parser.parse_args()
    counts = [int(m) for m in args.microbatches.split(",")]
    share, split = costliest_share(2)
    runs: dict[tuple[str, int], list[float]] = {}
    idle: dict[tuple[str, int], list[list[float]]] = {}
    spreads: dict[tuple[str, int], list[float]] = {}
    peaks: dict[tuple[str, int], list[int]] = {}
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-pp-") as tmp:
            store = Path(tmp)
            for m in counts:
                base = [f"train.grad_acc={m}"]
                one = measure(store, base)
                t1 = one["metrics"]["step_time_s"]
                peaks.setdefault(("pp1", m), one["metrics"]["peak_mem_bytes_per_rank"])
                for schedule in (PipelineSchedule.gpipe, PipelineSchedule.one_f_one_b):
                    if schedule == PipelineSchedule.one_f_one_b and m < 2:
                        continue
                    pp = measure(store, [*base, "parallel.pp=2", f"parallel.pp_schedule={schedule.value}"])
                    tpp = pp["metrics"]["step_time_s"]
                    runs.setdefault((schedule.value, m), []).append(1 - t1 * share / tpp)
                    idle.setdefault((schedule.value, m), []).append(pp["metrics"]["pipeline_idle_frac_per_rank"])
                    spreads.setdefault((schedule.value, m), []).append(
                        pp["metrics"]["step_time_spread_frac"] + one["metrics"]["step_time_spread_frac"]
                    )
                    peaks.setdefault((schedule.value, m), pp["metrics"]["peak_mem_bytes_per_rank"])
        print(f"repeat {repeat + 1} of {args.repeats} done", flush=True)

    print(f"\nsplit {[f'{r.start}-{r.stop - 1}' for r in split]}: costliest stage {share:.3f} of the FLOPs per token")
    print(
        "\n| schedule | m | predicted | idle in the run, stage 0 / 1: median [range] | across runs: median | runs |"
        " steps' spread |"
    )
    print("|---|---|---|---|---|---|---|")
    for (schedule, m), values in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        predicted = bubble_fraction(schedule, 2, m)
        in_run = " / ".join(f"{statistics.median(s):.3f} [{min(s):.3f}, {max(s):.3f}]" for s in zip(*idle[schedule, m]))
        spread = statistics.median(spreads[schedule, m])
        listed = ", ".join(f"{v:.3f}" for v in values)
        print(
            f"| {schedule} | {m} | {predicted:.3f} | {in_run} | {statistics.median(values):.3f} | {listed} | "
            f"±{spread:.0%} of a step |"
        )
    print("\n| point | m | peak per stage (MiB, the tracker's) |")
    print("|---|---|---|")
    for (name, m), per_rank in sorted(peaks.items()):
        print(f"| {name} | {m} | {', '.join(f'{b / 2**20:.2f}' for b in per_rank)} |")


if __name__ == "__main__":
    main()
