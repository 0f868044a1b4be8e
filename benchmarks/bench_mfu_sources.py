"""The MFU model, each source predicted from the others: leave-one-source-out on hardware=h100.

    python benchmarks/bench_mfu_sources.py

Sources (each a set of points of one origin): the measured H100 points of conf/mfu/h100.yaml (gpu_check, a 1B model
on one GPU), torchtitan's Table 1 in the same file (Llama 3.1 8B, FSDP over 8 H100, eager and compiled), and
torchtitan's FSDP over 128 H100 rows of the same page (`RUNS_128`: the 8B at seq 8192, local batch 2, selective per-op
checkpointing, eager and compiled; H100 SXM with 96 GB HBM2e at a 500 W limit; github.com/pytorch/torchtitan
benchmarks/llama3_h100_202412_torchtitan.md at 9dec370). A published figure is read as its run's step per GPU, the
communication it did not hide included, as conf/mfu/ reads it. For each source, the MFU model
(scaling.perf.mfu_model.fit) is fitted on the other sources alone and predicts the source's points: tokens/s per GPU,
the error, and whether each lies inside the model's 95% band (its σ: parameters, scatter, distance). llm-foundry's
tables serve the DP bands' check and are in none of the fits. Prints Markdown; asserts nothing.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling.perf.mfu_model import Measured, conf_points, fit
from scaling.recipe.predicted import counted
from scaling.sweep.compose import compose_config

PAGE = "torchtitan llama3_h100_202412 (9dec370), FSDP 128"
RUNS_128 = [
    {"model": "llama_8b", "seq_len": 8192, "mbs": 2, "zero_stage": 3, "recompute": "selective", "compile": False,
     "tokens_per_s_per_gpu": 5605, "source": f"{PAGE}"},
    {"model": "llama_8b", "seq_len": 8192, "mbs": 2, "zero_stage": 3, "recompute": "selective", "compile": True,
     "tokens_per_s_per_gpu": 6514, "source": f"{PAGE} + torch.compile"},
]  # fmt: skip
"""The two 128-GPU runs of the page whose 8-GPU runs conf/mfu/h100.yaml holds (bench_published_2d.py predicts them)."""


def source_of(p: Measured) -> str:
    """The source a point belongs to."""
    if not p.published:
        return "gpu_check H100 (1B, measured, 1 GPU)"
    return "torchtitan FSDP 128 (8B)" if "FSDP 128" in p.source else "torchtitan Table 1, FSDP 8 (8B)"


def main() -> None:
    """Fit on all sources but one, predict it, print."""
    peak = float(compose_config(["hardware=h100"]).hardware.peak_tflops_bf16) * 1e12
    points, optimizer, _ = conf_points("h100", peak, counted=counted)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "h100.yaml").write_text(yaml.safe_dump({"name": "h100", "published": RUNS_128}))
        extra, _, _ = conf_points("h100", peak, Path(tmp), counted=counted)
    points += extra
    sources = sorted({source_of(p) for p in points})
    print("| held-out source | points | fitted on | tokens/s per GPU: predicted [95% band] vs the source's | "
          "mean abs. error | inside |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    errors, inside, total = [], 0, 0
    for held in sources:
        rest = [p for p in points if source_of(p) != held]
        model = fit("h100", peak, rest, optimizer)
        cells, errs, ins = [], [], 0
        for p in (q for q in points if source_of(q) == held):
            e = model.estimate(p.work)
            step = p.grad_acc * e.seconds + p.work.flops.n_params * optimizer
            lo, hi = step * math.exp(-1.96 * e.sigma), step * math.exp(1.96 * e.sigma)
            tokens = p.grad_acc * p.work.tokens
            rate, truth = tokens / step, tokens / p.step_time_s
            ok = lo <= p.step_time_s <= hi
            ins += ok
            errs.append(rate / truth - 1)
            cells.append(
                f"{rate:,.0f} [{tokens / hi:,.0f}, {tokens / lo:,.0f}] vs {truth:,.0f} ({rate / truth - 1:+.0%})"
            )
        errors += errs
        inside += ins
        total += len(errs)
        fitted_on = ", ".join(s for s in sources if s != held)
        shown = "; ".join(cells[:4]) + (f"; … {len(cells) - 4} more" if len(cells) > 4 else "")
        print(f"| {held} | {len(errs)} | {fitted_on} | {shown} | "
              f"{100 * statistics.mean(abs(v) for v in errs):.1f}% | {ins} of {len(errs)} |")  # fmt: skip
    print()
    print(f"Over every point held out: mean absolute error {100 * statistics.mean(abs(v) for v in errors):.1f}%, "
          f"{inside} of {total} inside their band.")  # fmt: skip


if __name__ == "__main__":
    main()
