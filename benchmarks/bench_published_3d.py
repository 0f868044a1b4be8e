"""The recipe's predicted figures of 3-D layouts (tensor × pipeline × data parallelism) against published ones.

    python benchmarks/bench_published_3d.py [--draws 200]

Each published run is planned as the recipe plans a row with nothing measured (scaling.recipe.predicted: the H100's
MFU model fitted on conf/mfu/h100.yaml, the published H100 network, the step model with tensor parallelism's
collectives and the pipeline's bubble and sends, scaling.perf.pipeline), at the run's own layout: its GPUs, tp × pp ×
dp, its interleaved schedule and virtual stages, micro-batch 1 and its gradient accumulation (the micro-batches of the
pipeline). The figure and its 95% band against the published tokens/s per GPU (the published tokens/s over the GPUs).

Sources, all NVIDIA's DGX Cloud benchmarking recipes (github.com/NVIDIA/dgxc-benchmarking), NeMo 24.09 (Megatron-Core)
on DGX H100 (8 × H100 SXM 80 GB per node, InfiniBand between nodes), bf16, synthetic or Pile data, weak scaling (the
global batch grows with the GPUs), the last step's time of a 50-100-step run:

- GPT-3 175B, `nemo_megatron/README_175b.md` @ 0b71cfda, table "NeMo Megatron BF16 (TP=4,PP=8, MBS=1, VP=12,
  SEQ=2048)": 128-2048 GPUs, global batch 2 × GPUs. GPT-3's GELU MLP (4h) and learned positions read as the built-in
  decoder of the same width, depth and heads with a SwiGLU of 8/3 h (the same parameters per layer), vocabulary
  51,200.
- Llama 3.1 70B, `llama3.1/README_70b.md` @ 143b90dd, table "Llama 3.1 70b 24.09 BF16 (TP=4, PP=4, CP=2, VP=5,
  MBS=1, GA=64)": 64-2048 GPUs, seq 8192, global batch 2 × GPUs.
- Llama 3.1 405B, `llama3.1/README_405b.md` @ 143b90dd, table "Llama 3.1 405b 24.09 BF16 (TP=8, PP=9, CP=2, VP=7,
  MBS=1, GA=63)": the full model's columns (576, 1152, 2304 GPUs, 126 layers); the proxy columns (7-42 layers) are
  left out.

Not modelled, and what each does to the gap: Megatron's fused kernels (fused softmax, bias-GELU/SwiGLU, fused Adam)
and its distributed optimizer (read as ZeRO-1); context parallelism (CP=2) read as twice the dp ranks at half the
sequence (each rank's tokens per micro-step are the same, but attention's FLOPs per token are counted at seq/2, so
the compute is under-counted: a prediction above the published figure); sequence parallelism is not stated by these
tables and not modelled (tp's all-reduces charged whole). The recompute setting is not stated: each run is predicted
at none and full, which bracket it. The last column plans each run at its published MFU (the compute from the
table's own efficiency; the bubble, sends, tp's all-reduces and the optimizer's collectives from the step model):
what the parallel layout adds, apart from the MFU model's compute. Megatron's PTD-P table (Narayanan et al. 2021) and torchtitan's 405B 3-D runs are
not in this table: their figures could not be read from a source at hand. Prints Markdown; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from scaling.core.layout import Layout
from scaling.perf.network_figures import sources
from scaling.perf.pipeline import bubble_fraction
from scaling.recipe.estimate import workload_of
from scaling.recipe.options import Candidate, Split
from scaling.recipe.predicted import ModelFigures, predicted_figures
from scaling.recipe.request import RecipeRequest
from scaling.sweep.compose import compose_config

DGXC = "github.com/NVIDIA/dgxc-benchmarking"
GPT3_175B = [
    "model.name=gpt3_175b",
    "model.n_layers=96",
    "model.hidden=12288",
    "model.n_heads=96",
    "model.n_kv_heads=96",
    "model.ffn_hidden=32768",
    "model.vocab_size=51200",
]
LLAMA31_405B = [
    "model.name=llama31_405b",
    "model.n_layers=126",
    "model.hidden=16384",
    "model.n_heads=128",
    "model.n_kv_heads=8",
    "model.ffn_hidden=53248",
]


@dataclass(frozen=True)
class Published:
    """One published run: its model, layout, batch and tokens/s (of all its GPUs)."""

    name: str
    model: tuple[str, ...]
    """`scaling run` overrides of its model (llama_70b's shapes, changed where the run's model differs)."""
    seq_len: int
    tp: int
    pp: int
    virtual: int
    cp: int
    gpus: int
    gbs: int
    """Global batch in sequences of seq_len."""
    tokens_per_s: float
    mfu: float
    """The MFU the table publishes (its own FLOP count: attention, MLP and embedding, as its Notes write it)."""
    source: str


def _rows(name, model, seq, tp, pp, virtual, cp, source, table):
    return [Published(name, tuple(model), seq, tp, pp, virtual, cp, n, gbs, r, m, source) for n, gbs, r, m in table]


RUNS = (
    *_rows(
        "GPT-3 175B, TP 4 × PP 8 (VP 12)",
        GPT3_175B,
        2048,
        4,
        8,
        12,
        1,
        f"{DGXC} nemo_megatron/README_175b.md @ 0b71cfda",
        [
            (128, 256, 63099, 0.5354),
            (256, 512, 124712, 0.5291),
            (512, 1024, 249068, 0.5284),
            (1024, 2048, 496191, 0.5263),
            (2048, 4096, 988057, 0.5240),
        ],
    ),
    *_rows(
        "Llama 3.1 70B, TP 4 × PP 4 (VP 5) × CP 2",
        ["model=llama_70b"],
        8192,
        4,
        4,
        5,
        2,
        f"{DGXC} llama3.1/README_70b.md @ 143b90dd",
        [
            (64, 128, 71235, 0.5410),
            (256, 512, 283399, 0.5381),
            (1024, 2048, 1124478, 0.5338),
            (2048, 4096, 2248957, 0.5338),
        ],
    ),
    *_rows(
        "Llama 3.1 405B, TP 8 × PP 9 (VP 7) × CP 2",
        LLAMA31_405B,
        8192,
        8,
        9,
        7,
        2,
        f"{DGXC} llama3.1/README_405b.md @ 143b90dd",
        [(576, 252, 120022, 0.5578), (1152, 504, 235660, 0.5476), (2304, 1008, 468646, 0.5445)],
    ),
)


def predict(
    run: Published, recompute: str, draws: int, assume_mfu: float | None = None
) -> tuple[float, float, float, float, str]:
    """(tokens/s per GPU, low, high, the bubble, what the compute rests on) of the recipe's plan of `run`: its compute
    from the H100's MFU model, or at `assume_mfu` (the run's published MFU: what the rest of the model adds)."""
    seq = run.seq_len // run.cp  # context parallelism read as cp times the dp ranks at seq / cp
    overrides = list(run.model)
    base = ["model=llama_70b"] if not any(o.startswith("model=") for o in overrides) else []
    cfg = compose_config(
        [
            *base,
            *overrides,
            "hardware=h100",
            "train.precision=bf16",
            f"train.seq_len={seq}",
            "parallel.pp_schedule=interleaved_1f1b",
            f"parallel.pp_virtual={run.virtual}",
            "logger=none",
        ]
    )
    layout = Layout.over(run.gpus, 1, tp=run.tp, pp=run.pp)
    assert layout is not None, f"{run.name}: tp × pp does not divide {run.gpus} GPUs"
    gbs = run.gbs * run.cp
    grad_acc = gbs // layout.dp
    assert grad_acc * layout.dp == gbs, f"{run.name}: {gbs} samples do not split over dp {layout.dp}"
    candidate = Candidate(Layout(1, tp=run.tp, pp=run.pp), recompute, 1, "published")
    with tempfile.TemporaryDirectory() as empty:  # no profile: the published network figures
        found, _ = sources(Path(empty), "h100", cfg.hardware.devices_per_node, draws)
    request = RecipeRequest(gbs * seq, [run.gpus], [1], [recompute], draws=draws, assume_mfu=assume_mfu)
    figures = ModelFigures.of(cfg)
    predicted, note = predicted_figures(
        cfg, lambda c, mbs: workload_of(cfg, c, mbs, gbs, figures.shape), found[1], request
    )
    if predicted is None:
        raise SystemExit(f"{run.name}: no plan ({note})")
    estimate = predicted(candidate, Split(layout.dp, 1, grad_acc, gbs * seq, True))
    if estimate is None:
        raise SystemExit(f"{run.name}: past the network's reach")
    bubble = bubble_fraction("interleaved_1f1b", run.pp, grad_acc, run.virtual)
    return estimate.tokens_per_s_per_gpu, estimate.low, estimate.high, bubble, estimate.described()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=200, help="bootstrap draws of each band")
    a = p.parse_args()
    print(
        "| published run | GPUs | recompute | bubble | published | predicted [95% band] | error | covered | "
        "at the published MFU |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    details, errors = [], []
    for run in RUNS:
        published = run.tokens_per_s / run.gpus
        for recompute in ("none", "full"):
            rate, low, high, bubble, detail = predict(run, recompute, a.draws)
            error = rate / published - 1
            errors.append(abs(error))
            covered = "yes" if low <= published <= high else "no"
            at_mfu, _, _, _, _ = predict(run, recompute, a.draws, run.mfu)
            print(
                f"| {run.name} | {run.gpus} | {recompute} | {bubble:.1%} | {published:,.0f} | "
                f"{rate:,.0f} [{low:,.0f}, {high:,.0f}] | {error:+.0%} | {covered} | "
                f"{at_mfu:,.0f} ({at_mfu / published - 1:+.0%}) |"
            )
            if run.gpus == min(r.gpus for r in RUNS if r.name == run.name):
                details.append(f"- {run.name}, recompute {recompute}: {detail}")
    print(f"\nLargest error {max(errors):.0%}, median {sorted(errors)[len(errors) // 2]:.0%}.")
    print("\nWhat each prediction rests on (the fewest GPUs of each run):\n")
    print("\n".join(details))
    print("\nSources: " + "; ".join(sorted({r.source for r in RUNS})) + ".")


if __name__ == "__main__":
    main()
