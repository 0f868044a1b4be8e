"""Models people train, through the engine: Hugging Face families at ZeRO-3 on 2 ranks (dp=2, and dp=1 x tp=2 by
the family's own tensor-parallel plan), and a nanoGPT model.py.

    python benchmarks/bench_hf_families.py [--families gpt2,gemma2] [--tp 1,2] [--nanogpt PATH/TO/model.py]

Each family's tiny config is written by its own transformers config class (tests/helpers/hf_families.py) and run as
a point (seq 32, mbs 2, 2 warm-up and 2 timed steps, fp32, warm ranks): its status, its FLOPs per token counted on
fake tensors against PaLM's closed form (6·N + 6·L·T·H·(d_qk + d_v)), the traced peak against the tracked one, and
the first loss on random tokens against ln(vocab). The encoders and encoder-decoders are run too: refused before any
rank starts. `--nanogpt` copies a nanoGPT model.py, unmodified, beside a 10-line adapter that does no init of its
own (docs/own-project.md) and runs it at ZeRO-0 and ZeRO-3 (default: tests/own_project/nanogpt_style.py, written in
its style). Prints Markdown tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scaling.core.schema import ExperimentConfig  # noqa: E402
from scaling.job.run import run_point  # noqa: E402
from scaling.model.custom.build import build  # noqa: E402
from scaling.model.hf.config import read_config  # noqa: E402
from tests.helpers import hf_families as families  # noqa: E402

POINT = {
    "train": {"seq_len": 32, "mbs": 2, "warmup_steps": 2, "steps": 2},
    "logger": {"name": "none"},
    "launch": {"timeout_s": 300, "reuse": True, "reuse_idle_s": 120},
}
ADAPTER = '''"""nanoGPT's GPT behind the contract: keyword sizes in, every position's logits out; no init of its own."""
from model import GPT, GPTConfig


class NanoGPT(GPT):
    def __init__(self, vocab_size: int, max_seq_len: int, **config):
        super().__init__(GPTConfig(vocab_size=vocab_size, block_size=max_seq_len, **config))

    def forward(self, idx):
        return super().forward(idx, targets=idx)[0]  # given targets, GPT returns every position's logits
'''
NANO = {"vocab_size": 512, "max_seq_len": 256, "n_layer": 2, "n_head": 4, "n_embd": 64}


def _pct(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.2f}%"


def row(name: str, record: dict[str, Any], closed: float | None, vocab: int, kind: str) -> str:
    """One table row of a point's record."""
    status = record["status"]
    if status != "ok":
        return f"| {name} | {kind} | {status} | {record['error']} | | | | |"
    derived, metrics = record["derived"], record["metrics"]
    flops = derived["flops_per_token"]
    predicted, measured = record["predicted"]["peak_mem_bytes"], metrics["peak_mem_bytes"]
    first = metrics["losses"][0]
    return (
        f"| {name} | {kind} | ok | {derived['n_params']:,} | {flops:,.0f} vs {closed:,.0f} ({_pct(flops, closed)}) | "
        f"{predicted:,} vs {measured:,} ({_pct(predicted, measured)}) | {first:.4f} vs {math.log(vocab):.4f} "
        f"({_pct(first, math.log(vocab))}) | {derived['model']['init']}, {derived['model']['attention']} |"
    )


LAYOUTS = {1: {"dp": 2, "zero_stage": 3}, 2: {"dp": 1, "tp": 2, "zero_stage": 3}}
"""The two ranks of each row: dp=2 at tp=1, dp=1 x tp=2 (the family's own plan) at tp=2; ZeRO-3 either way."""


def hf_rows(names: list[str], work: Path, tp: int) -> None:
    layout = "dp=2" if tp == 1 else "dp=1 x tp=2"
    print(f"\n| family | kind | status at ZeRO-3 {layout} | n_params | FLOPs/token counted vs closed form | traced vs "
          "tracked peak, bytes | first loss vs ln(vocab) | init, attention |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    work.mkdir()
    for name in names:
        path = families.write_config(name, work)
        cfg = ExperimentConfig.from_dict({"model": {"name": name, "hf_config": str(path)}, **POINT}).changed(
            parallel=LAYOUTS[tp]
        )
        cfg.sweep_dir = str(work / "runs")
        record = run_point(cfg)
        kind = ", ".join(
            k
            for k, group in (
                ("MoE", families.MOE), ("tied", families.TIED), ("sliding window", families.SLIDING),
                ("encoder or encoder-decoder", families.REFUSED),
            )
            if name in group
        )  # fmt: skip
        closed = None
        if record["status"] == "ok":
            text = read_config(**cfg.model.kwargs).text
            closed = families.palm_flops_per_token(build(cfg.model, "meta"), text, cfg.train.seq_len)
        print(row(name, record, closed, families.V, kind or "dense"), flush=True)


def nanogpt_rows(model_py: Path, work: Path) -> None:
    """nanoGPT's model.py, as it is, beside the adapter: ZeRO-0 and ZeRO-3 at dp=2."""
    project = work / "nanogpt"
    project.mkdir()
    shutil.copy(model_py, project / "model.py")
    (project / "nanogpt.py").write_text(ADAPTER)
    os.chdir(project)
    import torch

    sys.path.insert(0, str(project))
    from model import GPT, GPTConfig

    tied = sum(
        p.numel() for p in GPT(GPTConfig(vocab_size=512, block_size=256, n_layer=2, n_head=4, n_embd=64)).parameters()
    )
    print(f"\nnanoGPT {model_py} (sha256 {__import__('hashlib').sha256(model_py.read_bytes()).hexdigest()[:12]}), "
          f"torch {torch.__version__}; tied parameter count {tied:,}\n")  # fmt: skip
    print("| ZeRO | status | n_params | FLOPs/token | traced vs tracked peak, bytes | first loss vs ln(vocab) | init |")
    print("|---|---|---|---|---|---|---|")
    for stage in (0, 3):
        cfg = ExperimentConfig.from_dict({"model": {"name": "nanogpt", "_target_": "nanogpt.NanoGPT", **NANO}, **POINT})
        cfg = cfg.changed(parallel={"dp": 2, "zero_stage": stage})
        cfg.sweep_dir = str(project / "runs")
        r = run_point(cfg)
        if r["status"] != "ok":
            print(f"| {stage} | {r['status']} | {r['error']} | | | | |")
            continue
        m, d = r["metrics"], r["derived"]
        predicted, measured, first = r["predicted"]["peak_mem_bytes"], m["peak_mem_bytes"], m["losses"][0]
        print(
            f"| {stage} | ok | {d['n_params']:,} | {d['flops_per_token']:,.0f} | {predicted:,} vs {measured:,} "
            f"({_pct(predicted, measured)}) | {first:.4f} vs {math.log(512):.4f} ({_pct(first, math.log(512))}) | "
            f"{d['model']['init']} |",
            flush=True,
        )


def main() -> None:
    """Run the families (and nanoGPT) and print their tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default=",".join([*families.CAUSAL, *families.REFUSED]))
    p.add_argument("--tp", default="1,2", help="tensor-parallel degrees, each a table (1: dp=2; 2: dp=1 x tp=2)")
    p.add_argument("--nanogpt", type=Path, default=REPO / "tests" / "own_project" / "nanogpt_style.py")
    a = p.parse_args()
    import transformers

    print(f"transformers {transformers.__version__}\n")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for tp in (int(t) for t in a.tp.split(",") if t):
            hf_rows([n for n in a.families.split(",") if n], work / f"tp{tp}", tp)
        nanogpt_rows(a.nanogpt.resolve(), work)


if __name__ == "__main__":
    main()
