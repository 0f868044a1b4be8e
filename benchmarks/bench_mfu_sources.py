"""The MFU model, each source predicted from the others: leave-one-source-out on hardware=h100 and hardware=a100.

    python benchmarks/bench_mfu_sources.py

A source is one publication (or this project's own measurements) of conf/mfu/<hardware>.yaml: a published row's
source names it before its first comma. h100: the measured points (gpu_check, a 1B model on one GPU), torchtitan's
llama3_h100_202412 page (Llama 3.1 8B, FSDP over 8 and 128 H100 at 500 W, eager and compiled) and IBM fms-fsdp's
README (Llama 2 7B-70B over 96 H100, eager and compiled). a100: torchtitan's docs/performance.md (Llama 3 8B and 70B,
Llama 2 13B and 70B, FSDP over 64 A100, eager) and fms-fsdp's README (the same four Llama 2 models over 128 A100).
A published figure is read as its run's step per GPU, the communication it did not hide included, as conf/mfu/ reads
it. For each source, the MFU model (scaling.perf.mfu_model.fit) is fitted on the other sources of the same hardware
alone and predicts the source's points: tokens/s per GPU, the error, and whether each lies inside the model's 95% band
(its σ: parameters, scatter, distance). A hardware with a single source has nothing to predict it from and is listed
as such. llm-foundry's tables serve the DP bands' check and are in none of the fits. Prints Markdown; asserts nothing.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling.perf.mfu_model import Measured, conf_points, fit
from scaling.recipe.predicted import counted
from scaling.sweep.compose import compose_config

HARDWARE = ("h100", "a100")
SHOWN = 4
"""Points shown per source in the table (the rest counted)."""


def source_of(p: Measured, hardware: str) -> str:
    """The publication a point belongs to: the text of its published source before the first comma, or this
    project's own measurements."""
    if not p.published:
        return f"measured on {hardware} (gpu_check)"
    return p.source.split("published: ", 1)[1].split(",")[0]


def label(p: Measured) -> str:
    """A point in a few words: the model and the rest of its source (or its micro-step when measured)."""
    model = p.source.split(":")[0]
    if p.published:
        return f"{model} {p.source.split(',', 1)[1].strip()}"
    w = p.work
    how = f"{' full recompute' if w.recomputed else ''}{' compiled' if w.compile else ''}"
    return f"{model} seq {w.seq_len} mbs {w.tokens // w.seq_len} ZeRO-{w.zero_stage}{how}"


def held_out(hardware: str) -> list[float]:
    """Print the hardware's table and return the held-out points' relative errors of tokens/s per GPU."""
    peak = float(compose_config([f"hardware={hardware}"]).hardware.peak_tflops_bf16) * 1e12
    points, optimizer, _ = conf_points(hardware, peak, counted=counted)
    sources = sorted({source_of(p, hardware) for p in points})
    print(f"### hardware={hardware} ({len(points)} points, {len(sources)} sources)\n")
    print("| held-out source | points | fitted on | tokens/s per GPU: predicted [95% band] vs the source's | "
          "mean error | mean abs. error | inside |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    errors: list[float] = []
    inside = 0
    for held in sources:
        rest = [p for p in points if source_of(p, hardware) != held]
        own = [p for p in points if source_of(p, hardware) == held]
        if not rest:
            print(
                f"| {held} | {len(own)} | – (the hardware's only source: nothing to predict it from) | – | – | – | – |"
            )
            continue
        model = fit(hardware, peak, rest, optimizer)
        cells, errs, ins = [], [], 0
        for p in own:
            e = model.estimate(p.work)
            step = p.grad_acc * e.seconds + p.work.flops.n_params * optimizer
            lo, hi = step * math.exp(-1.96 * e.sigma), step * math.exp(1.96 * e.sigma)
            tokens = p.grad_acc * p.work.tokens
            rate, truth = tokens / step, tokens / p.step_time_s
            ok = lo <= p.step_time_s <= hi
            ins += ok
            errs.append(rate / truth - 1)
            cells.append(
                f"{label(p)}: {rate:,.0f} [{tokens / hi:,.0f}, {tokens / lo:,.0f}] vs {truth:,.0f} "
                f"({rate / truth - 1:+.0%}{'' if ok else ', out'})"
            )
        errors += errs
        inside += ins
        fitted_on = ", ".join(s for s in sources if s != held)
        shown = "; ".join(cells[:SHOWN]) + (f"; … {len(cells) - SHOWN} more" if len(cells) > SHOWN else "")
        print(f"| {held} | {len(errs)} | {fitted_on} | {shown} | {100 * statistics.mean(errs):+.1f}% | "
              f"{100 * statistics.mean(abs(v) for v in errs):.1f}% | {ins} of {len(errs)} |")  # fmt: skip
    if errors:
        print(f"\nhardware={hardware}, every point held out: mean absolute error "
              f"{100 * statistics.mean(abs(v) for v in errors):.1f}%, {inside} of {len(errors)} inside their band.\n")  # fmt: skip
    return errors


def main() -> None:
    """Each hardware's sources, each held out in turn; then the figure over both."""
    every = [e for hw in HARDWARE for e in held_out(hw)]
    print(f"Over both hardwares, every point held out: mean absolute error "
          f"{100 * statistics.mean(abs(v) for v in every):.1f}% ({len(every)} points).")  # fmt: skip


if __name__ == "__main__":
    main()
