"""Models nobody here wrote, and recomputation, on a real GPU: measured, then each point beside what the project
predicted of it (the traced and the analytic peak, the MFU model's tokens/s).

    python benchmarks/gpu_models.py measure [--sweep-dir runs/gpu-models] [--budget-s 480]   # needs CUDA
    python benchmarks/gpu_models.py report [--sweep-dir runs/gpu-models] [--hardware h200]   # any machine

`measure` writes a project of one's own under the sweep directory (docs/own-project.md): three Hugging Face configs
at published shapes, made by transformers' own config classes (Qwen3-1.7B; Gemma-2-2B; a mixture of experts, 4 of
Qwen3-30B-A3B's 48 layers at its shapes: 128 experts, 8 per token, at seq 128: transformers' `batched_mm` experts,
which the engine runs, gather each token's 8 experts' weights, about 0.4 GiB a token here), and nanoGPT's GPT at GPT-2 small's shapes
(tests/own_project's nanoGPT-style file behind its 10-line adapter). It runs each at ZeRO-0 in bf16 on one GPU, then
the built-in llama_1b at seq 4096 mbs 2 with recompute none, selective and full, eager and compiled, and llama_1b at
seq 4096 mbs 8 (out of memory on the H200 page by fragmentation) again under
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`. Each point's traced peak (scaling.predictor.trace, on fake tensors)
is taken before it runs. Records go to the sweep directory, one JSON line per point to `points.jsonl` beside them.

`report` reads `points.jsonl` and prints one table: tokens/s per GPU, MFU (counted FLOPs for the models one brings),
the peak allocated against the traced and the analytic prediction, and the MFU model of `--hardware` (fitted on
conf/mfu/<hardware>.yaml alone, none of these points) predicting each eager or compiled point's micro-step. Asserts
nothing; prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scaling.core.units import GIB  # noqa: E402

BASE = ["train.precision=bf16", "train.warmup_steps=2", "train.steps=5", "logger=none", "launch.timeout_s=300"]
QWEN3_1_7B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
GEMMA2_2B = dict(
    vocab_size=256000,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=8192,
    sliding_window=4096,
    query_pre_attn_scalar=256,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
)
QWEN3_MOE_4L = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
NANOGPT_124M = """# nanoGPT's GPT at GPT-2 small's shapes (nano.py's adapter beside nanogpt_style.py)
name: nanogpt_124m
_target_: nano.NanoGPT
vocab_size: 50304
max_seq_len: 1024
n_layer: 12
n_head: 12
n_embd: 768
"""
LLAMA = ["model=llama_1b", "train.seq_len=4096"]
"""The built-in llama_1b at seq 4096, as the H200 page ran it."""
POINTS: list[tuple[str, list[str], dict[str, str]]] = [
    ("llama_1b none eager", [*LLAMA, "train.mbs=2"], {}),
    ("Qwen3-1.7B", ["model=hf_qwen3_1_7b", "train.seq_len=4096", "train.mbs=2"], {}),
    ("Gemma-2-2B", ["model=hf_gemma2_2b", "train.seq_len=4096", "train.mbs=1"], {}),
    ("Qwen3-MoE 4 layers", ["model=hf_qwen3_moe_4l", "train.seq_len=128", "train.mbs=1"], {}),
    ("nanoGPT 124M", ["model=nanogpt_124m", "train.seq_len=1024", "train.mbs=16"], {}),
    *[
        (
            f"llama_1b {rc} {'compiled' if compile_ else 'eager'}",
            [*LLAMA, "train.mbs=2", f"train.recompute={rc}", *(["train.compile=true"] if compile_ else [])],
            {},
        )
        for rc, compile_ in (("selective", False), ("full", False), ("selective", True), ("full", True), ("none", True))
    ],
    (
        "llama_1b mbs 8 expandable",
        [*LLAMA, "train.mbs=8", "launch.prescreen=false"],
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    ),
]
"""(label, overrides, environment): the most informative first (a budget cut drops the last)."""


def write_project(project: Path) -> None:
    """A project of one's own: conf/model/ with the three HF configs (their config classes' JSON) and nanoGPT."""
    import transformers as t

    models = project / "conf" / "model"
    models.mkdir(parents=True, exist_ok=True)
    for name, cls, fields in (
        ("hf_qwen3_1_7b", t.Qwen3Config, QWEN3_1_7B),
        ("hf_gemma2_2b", t.Gemma2Config, GEMMA2_2B),
        ("hf_qwen3_moe_4l", t.Qwen3MoeConfig, QWEN3_MOE_4L),
    ):
        cls(**fields).to_json_file(models / f"{name}.json")
        (models / f"{name}.yaml").write_text(f"name: {name}\nhf_config: model/{name}.json\n")
    (models / "nanogpt_124m.yaml").write_text(NANOGPT_124M)
    for f in ("nano.py", "nanogpt_style.py"):
        shutil.copy(REPO / "tests" / "own_project" / f, project / f)


def measure(sweep_dir: Path, budget_s: float, hardware: str) -> int:
    """Every point (traced first, then run), one JSON line each in sweep_dir/points.jsonl."""
    from scaling.job.run import run_point
    from scaling.model.family import family_of
    from scaling.predictor.analytic import predict_config
    from scaling.predictor.trace import TraceError, trace_peak_isolated
    from scaling.sweep.compose import compose_config

    project = sweep_dir / "project"
    write_project(project)
    os.chdir(project)  # its conf/ is found beside the shipped one, its modules on the path
    sys.path.insert(0, str(project))
    deadline = time.monotonic() + budget_s
    lines = sweep_dir / "points.jsonl"
    for label, overrides, env in POINTS:
        if time.monotonic() + 45 > deadline:
            print(f"skipped for time: {label}", flush=True)
            continue
        where = sweep_dir / ("expandable" if env else "points")
        cfg = compose_config([*BASE, f"hardware={hardware}", f"sweep_dir={where}", *overrides])
        started = time.monotonic()
        try:
            traced: Optional[int] = trace_peak_isolated(cfg).peak_mem_bytes
            trace_note = ""
        except TraceError as e:
            traced, trace_note = None, str(e)
        trace_s = time.monotonic() - started
        os.environ.update(env)
        try:
            record = run_point(cfg)
        finally:
            for k in env:
                os.environ.pop(k, None)
        analytic = predict_config(cfg).total_bytes if family_of(cfg.model).closed_form else None
        row = {"label": label, "env": env, "traced": traced, "analytic": analytic, "trace_note": trace_note}
        row["trace_s"] = trace_s
        with lines.open("a") as f:
            f.write(json.dumps({**row, "record": record}, default=str) + "\n")
        m = record.get("metrics") or {}
        print(
            f"{label}: {record['status']} tok/s/GPU {m.get('tokens_per_s_per_gpu')} MFU {m.get('mfu')} "
            f"peak {m.get('peak_mem_bytes')} traced {traced} ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    return 0


def report(sweep_dir: Path, hardware: str) -> int:
    """The table of points.jsonl, each point beside the MFU model's figure for it."""
    from scaling.engine.peak_flops import configured_peak_flops_per_s
    from scaling.recipe.predicted import mfu_model, record_work
    from scaling.sweep.compose import compose_config

    rows = [json.loads(line) for line in (sweep_dir / "points.jsonl").read_text().splitlines() if line.strip()]
    print(
        "| point | status | tokens/s/GPU | MFU | FLOPs/token | step spread | peak alloc GiB | traced GiB | error | "
        f"analytic GiB | error | MFU model ({hardware}) | its tokens/s/GPU | error |"
    )
    print("|" + "---|" * 14)
    peak_flops = configured_peak_flops_per_s(compose_config([f"hardware={hardware}"]).hardware, "bf16")
    model = mfu_model(hardware, "bf16", peak_flops, []) if peak_flops else None
    for row in rows:
        r = row["record"]
        m, d = r.get("metrics") or {}, r.get("derived") or {}
        peak = m.get("peak_mem_bytes")
        traced, analytic = row.get("traced"), row.get("analytic")
        predicted_tps = mfu = sigma = None
        if r["status"] == "ok":
            work = record_work(r)
            est = model.estimate(work) if model is not None else None
            if est is not None:  # tokens/s per GPU at dp=1: a micro-step's tokens over its seconds
                predicted_tps = work.tokens / est.seconds
                mfu, sigma = est.mfu, est.sigma
        times = m.get("step_times_s") or []
        spread = (max(times) - min(times)) / statistics.median(times) if times else None

        def err(p: Any, q: Any) -> str:
            return f"{(p - q) / q:+.1%}" if p and q else ""

        def gib(b: Any) -> str:
            return f"{b / GIB:.2f}" if b else ""

        tps = m.get("tokens_per_s_per_gpu")
        print(
            f"| {row['label']} | {r['status']} | {tps or 0:,.0f} | {m.get('mfu') or 0:.1%} | "
            f"{(d.get('flops_per_token') or 0) / 1e9:.3f} G | {spread or 0:.1%} | {gib(peak)} | {gib(traced)} | "
            f"{err(traced, peak)} | {gib(analytic)} | {err(analytic, peak)} | {'' if mfu is None else f'{mfu:.1%} ± {sigma:.0%}'} | "
            f"{predicted_tps or 0:,.0f} | {err(predicted_tps, tps)} |"
        )
        if r["status"] != "ok":
            print(f"|  {row['label']}: {str(r.get('error'))[:300]} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_models", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("measure", "report"))
    p.add_argument("--sweep-dir", type=Path, default=Path("runs/gpu-models"))
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--hardware", default="h200")
    a = p.parse_args(argv)
    sweep_dir = a.sweep_dir.resolve()
    if a.what == "report":
        return report(sweep_dir, a.hardware)
    import torch

    if not torch.cuda.is_available():
        print("gpu_models: no CUDA device found: nothing measured (`report` reads a measured sweep)", file=sys.stderr)
        return 1
    sweep_dir.mkdir(parents=True, exist_ok=True)
    return measure(sweep_dir, a.budget_s, a.hardware)


if __name__ == "__main__":
    sys.exit(main())
