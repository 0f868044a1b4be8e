"""Each pipeline stage's analytic peak against the same stage traced on fake tensors, side by side.

    python benchmarks/bench_stage_memory.py

The analytic stage peaks (scaling.predictor.stage_memory) and the traced ones (scaling.predictor.stage_trace: the
stage's own modules of the built-in model in the schedule's order under torch's memory tracker, two steps, the second
tracked) of CPU-sized points at dp 1, tp 1 and ZeRO-0, GPipe and 1F1B, fp32 and bf16, with and without full
recomputation. Not a measurement of the engine's stages (torch.distributed.pipelining is not what runs here): a check
of the arithmetic's assumptions (the micro-batches in flight, each stage's share) against the tensors torch keeps.
Prints Markdown; asserts nothing.
"""

from __future__ import annotations

import time

from scaling.predictor.stage_memory import predict_stages
from scaling.predictor.stage_trace import trace_stage_peaks
from scaling.sweep.compose import compose_config

POINTS = (
    ("small", 2, 4, 128, 2, "one_f_one_b", "fp32", "none"),
    ("small", 2, 4, 128, 2, "gpipe", "fp32", "none"),
    ("small", 2, 8, 128, 4, "one_f_one_b", "fp32", "none"),
    ("small", 2, 4, 128, 2, "one_f_one_b", "bf16", "none"),
    ("small", 4, 2, 64, 2, "one_f_one_b", "fp32", "full"),
    ("tiny", 2, 4, 64, 2, "one_f_one_b", "fp32", "none"),
    ("tiny", 2, 4, 64, 2, "gpipe", "fp32", "none"),
)


def main() -> None:
    print(
        "| model | mbs | grad_acc | seq | pp | schedule | precision | recompute | stage | analytic | traced | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    errors, fullest, t0 = [], [], time.perf_counter()
    for model, mbs, ga, seq, pp, schedule, precision, recompute in POINTS:
        cfg = compose_config(
            [
                f"model={model}",
                f"train.mbs={mbs}",
                f"train.grad_acc={ga}",
                f"train.seq_len={seq}",
                f"parallel.pp={pp}",
                f"parallel.pp_schedule={schedule}",
                f"train.precision={precision}",
                f"train.recompute={recompute}",
            ]
        )
        analytic = [s.breakdown.total_bytes for s in predict_stages(cfg, ga)]
        traced = trace_stage_peaks(cfg, ga)
        for stage, (a, t) in enumerate(zip(analytic, traced)):
            errors.append(a / t - 1)
            print(
                f"| {model} | {mbs} | {ga} | {seq} | {pp} | {schedule} | {precision} | {recompute} | {stage} | "
                f"{a:,} | {t:,} | {a / t - 1:+.2%} |"
            )
        top = max(range(pp), key=lambda s: traced[s])
        fullest.append(analytic[top] / traced[top] - 1)
    print(
        f"\nEvery stage: {min(errors):+.1%} to {max(errors):+.1%}; the fullest traced stage of each point: "
        f"{min(fullest):+.1%} to {max(fullest):+.1%} ({time.perf_counter() - t0:.0f} s)."
    )


if __name__ == "__main__":
    main()
