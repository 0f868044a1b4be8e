"""The recipe's predicted figures of FSDP + TP layouts against published ones.

    python benchmarks/bench_published_2d.py [--draws 200]

Each published run is planned as the recipe plans a row with nothing measured (scaling.recipe.predicted: the
hardware's MFU model fitted on conf/mfu/h100.yaml, the published H100 network, the step model with tensor
parallelism's collectives), at the run's own layout: its GPUs, dp × tp, ZeRO-3 over dp, its micro-batch and no
gradient accumulation, its activation checkpointing (per-op selective checkpointing as `train.recompute=selective`,
charged its FLOPs, which are those without recomputation, beside none and full). The figure and its 95% band against the published tokens/s per GPU. The
sources are torchtitan's benchmark pages (github.com/pytorch/torchtitan, benchmarks/): none of their 2-D runs was
used to fit anything; their 1-D Llama 3.1 8B runs (8 and 128 GPUs) are points of conf/mfu/h100.yaml, and each is
predicted by the MFU model refitted without their page (as benchmarks/bench_mfu_sources.py holds a source out), so
every run here is held out. Prints Markdown; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling.core.layout import Layout
from scaling.perf.mfu_model import fit
from scaling.perf.network_figures import sources
from scaling.recipe.estimate import workload_of
from scaling.recipe.options import Candidate, Split
from scaling.recipe.predicted import ModelFigures, predicted_figures
from scaling.recipe.request import RecipeRequest
from scaling.sweep.compose import compose_config

PAGE_2D = "asyncTP_llama3_h100_2025-06_torchtitan.md (torchtitan 820504e, 2025-06), vanilla TP, bf16"
PAGE_1D = "llama3_h100_202412_torchtitan.md (torchtitan 9dec370, 2024-12), Tables 1 and 3"
PAGE_1D_SOURCE = "torchtitan llama3_h100_202412"
"""How conf/mfu/h100.yaml names the 1-D page's rows (a source's text before its first comma)."""
CONDITIONS = "H100 SXM with 96 GB HBM2e at a 500 W limit (the profile's peak is the 700 W card's), 400 Gb/s per GPU"


@dataclass(frozen=True)
class Published:
    """One published run: its layout and its tokens/s per GPU."""

    name: str
    model: str
    gpus: int
    tp: int
    seq_len: int
    local_batch: int
    """Samples per dp rank per step (torchtitan's local batch: one micro-batch, no accumulation)."""
    recompute: tuple[str, ...]
    """The settings to predict it at: its own (selective per-op checkpointing, as `train.recompute=selective`, or
    full) and, for a selective run, the none and full that bracket it."""
    compile: bool
    tokens_per_s_per_gpu: float
    source: str
    in_fit: bool = False
    """Whether conf/mfu/h100.yaml holds it: then it is predicted by the MFU model refitted without its page."""


RUNS = (
    Published("Llama 3 70B, FSDP 32 × TP 8, full AC", "llama_70b", 256, 8, 8192, 16, ("full",), True, 597.3, PAGE_2D),
    Published(
        "Llama 3 8B, FSDP 8 × TP 8, per-op SAC",
        "llama_8b",
        64,
        8,
        8192,
        12,
        ("none", "selective", "full"),
        True,
        4378.0,
        PAGE_2D,
    ),
    Published(
        "Llama 3.1 8B, FSDP 8, SAC",
        "llama_8b",
        8,
        1,
        8192,
        2,
        ("none", "selective", "full"),
        False,
        5762.0,
        PAGE_1D,
        True,
    ),
    Published(
        "Llama 3.1 8B, FSDP 8, SAC, compiled",
        "llama_8b",
        8,
        1,
        8192,
        2,
        ("none", "selective", "full"),
        True,
        6667.0,
        PAGE_1D,
        True,
    ),
    Published(
        "Llama 3.1 8B, FSDP 128, SAC",
        "llama_8b",
        128,
        1,
        8192,
        2,
        ("none", "selective", "full"),
        False,
        5605.0,
        PAGE_1D,
        True,
    ),
    Published(
        "Llama 3.1 8B, FSDP 128, SAC, compiled",
        "llama_8b",
        128,
        1,
        8192,
        2,
        ("none", "selective", "full"),
        True,
        6514.0,
        PAGE_1D,
        True,
    ),
)


def predict(run: Published, recompute: str, draws: int) -> tuple[float, float, float, str]:
    """(tokens/s per GPU, low, high, what the compute rests on) of the recipe's plan of `run` at `recompute`."""
    cfg = compose_config(
        [
            f"model={run.model}",
            "hardware=h100",
            "train.precision=bf16",
            f"train.seq_len={run.seq_len}",
            f"train.compile={str(run.compile).lower()}",
            "logger=none",
        ]
    )
    layout = Layout.over(run.gpus, 3, tp=run.tp)
    assert layout is not None, f"{run.name}: tp {run.tp} does not divide {run.gpus} GPUs"
    gbs = layout.dp * run.local_batch
    candidate = Candidate(Layout(3, tp=run.tp), recompute, run.local_batch, "published")
    with tempfile.TemporaryDirectory() as empty:  # no profile: the published network figures
        found, _ = sources(Path(empty), "h100", cfg.hardware.devices_per_node, draws)
    request = RecipeRequest(gbs * run.seq_len, [run.gpus], [3], [recompute], draws=draws)
    figures = ModelFigures.of(cfg)
    predicted, note = predicted_figures(
        cfg, lambda c, mbs: workload_of(cfg, c, mbs, gbs, figures.shape), found[1], request
    )
    if predicted is None:
        raise SystemExit(f"{run.name}: no plan ({note})")
    if run.in_fit:  # held out all the same: the MFU model refitted without the run's page (bench_mfu_sources.py)
        model = predicted.model
        rest = [p for p in model.points if not p.source.split("published: ")[-1].startswith(PAGE_1D_SOURCE)]
        predicted = replace(
            predicted, model=fit(model.hardware, model.peak_flops_per_s, rest, model.optimizer_s_per_param)
        )
    estimate = predicted(candidate, Split(layout.dp, run.local_batch, 1, gbs * run.seq_len, True))
    if estimate is None:
        raise SystemExit(f"{run.name}: past the network's reach")
    return estimate.tokens_per_s_per_gpu, estimate.low, estimate.high, estimate.described()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=200, help="bootstrap draws of each band")
    a = p.parse_args()
    print(f"Conditions of every run: {CONDITIONS}.\n")
    print("| published run | GPUs | source | recompute | published | predicted [95% band] | error | covered |")
    print("|---|---|---|---|---|---|---|---|")
    details, own = [], []
    for run in RUNS:
        for recompute in run.recompute:
            rate, low, high, detail = predict(run, recompute, a.draws)
            error = rate / run.tokens_per_s_per_gpu - 1
            covered = "yes" if low <= run.tokens_per_s_per_gpu <= high else "no"
            note = " (its page held out of the MFU model's fit)" if run.in_fit else ""
            print(
                f"| {run.name}{note} | {run.gpus} | {run.source.split(' (')[0]} | {recompute} | "
                f"{run.tokens_per_s_per_gpu:,.0f} | {rate:,.0f} [{low:,.0f}, {high:,.0f}] | {error:+.0%} | {covered} |"
            )
            details.append(f"- {run.name}, recompute {recompute}: {detail}")
            if recompute == run.recompute[1 if len(run.recompute) > 1 else 0]:
                own.append(error)  # the run's own setting (selective for per-op SAC), its page held out of the fit
    print(
        f"\nAt each run's own recompute setting, held out of every fit: mean absolute error "
        f"{100 * statistics.mean(abs(e) for e in own):.1f}% over {len(own)} runs (largest {100 * max(abs(e) for e in own):.1f}%)."
    )
    from benchmarks.bench_extrapolation import published_rows  # the DP tables, fitted on their smaller counts

    errors: dict[str, list[float]] = {}
    published_rows(a.draws, errors=errors)
    dp = errors["(c) published network"]
    every = [*own, *dp]
    print(
        f"Every published row held out ({len(dp)} rows of the DP tables in tests/helpers/published_dp.py, extrapolated "
        f"from their smaller GPU counts under the published network, and the {len(own)} runs above with nothing "
        f"measured): mean absolute error of tokens/s per GPU {100 * statistics.mean(abs(e) for e in every):.1f}% "
        f"(the DP rows {100 * statistics.mean(abs(e) for e in dp):.1f}%, the runs above "
        f"{100 * statistics.mean(abs(e) for e in own):.1f}%)."
    )
    print("\nWhat each prediction rests on:\n")
    print("\n".join(details))
    print(f"\nSources: {PAGE_2D}; {PAGE_1D}.")


if __name__ == "__main__":
    main()
