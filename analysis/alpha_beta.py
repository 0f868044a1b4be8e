"""The α-β model of ring collectives, its fit to measured timings, and DP extrapolation with it.

A ring collective over n ranks on an S-byte buffer costs `t = steps·α + bytes/β`:
all-reduce takes 2(n−1) steps moving 2(n−1)/n·S bytes per rank; reduce-scatter and all-gather
take (n−1) steps moving (n−1)/n·S. α is the per-step latency (s), β the link bandwidth (B/s).

`measure` runs the `scaling.engine.collectives` worker under torchrun and fits α and β; `extrapolate`
combines them with a configuration's measured compute time to predict tokens/s per GPU at dp
up to 1024, assuming no overlap of communication with compute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from scaling.engine.collectives import OPS

PROFILE_FILE = "alpha_beta.json"
"""Name of the fitted profile inside a sweep directory; the report extrapolates when it is there."""
DEFAULT_SIZES = (4 * 1024, 64 * 1024, 1024**2, 4 * 1024**2, 16 * 1024**2)
GRAD_BYTES = {"bf16": 2, "fp32": 4}
"""Bytes per gradient element communicated, by `train.precision`."""


def ring_cost(op: str, n: int, size_bytes: float) -> tuple[int, float]:
    """(steps, bytes sent per rank) of a ring collective over n ranks on an S-byte buffer."""
    if op not in OPS:
        raise ValueError(f"op={op!r} is not a collective of the model: use one of {', '.join(OPS)}")
    if n < 1:
        raise ValueError(f"n={n} ranks: a collective needs n >= 1")
    if op == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n * size_bytes
    return n - 1, (n - 1) / n * size_bytes


@dataclass(frozen=True)
class AlphaBeta:
    """Fitted per-step latency α (s) and bandwidth β (bytes/s) of one interconnect."""

    alpha_s: float
    beta_bytes_per_s: float
    name: str = "fitted"

    def time_s(self, op: str, n: int, size_bytes: float) -> float:
        """Predicted seconds of one collective."""
        steps, moved = ring_cost(op, n, size_bytes)
        return steps * self.alpha_s + moved / self.beta_bytes_per_s


def fit(samples: Iterable[Mapping[str, Any]], name: str = "fitted") -> AlphaBeta:
    """Least-squares α and β from samples {op, world_size, size_bytes, time_s}, in relative error.

    Each equation is divided by its measured time, so 4 KiB and 64 MiB messages weigh alike and
    α (set by small messages) is found as well as β (set by large ones).
    """
    rows, times = [], []
    for s in samples:
        steps, moved = ring_cost(s["op"], int(s["world_size"]), float(s["size_bytes"]))
        if steps:
            rows.append((steps, moved))
            times.append(float(s["time_s"]))
    a, t = np.asarray(rows, dtype=float), np.asarray(times, dtype=float)
    if len(t) < 2 or np.linalg.matrix_rank(a) < 2:
        raise ValueError(f"fit needs timings of at least two sizes at world_size >= 2; got {len(t)} usable samples")
    if (t <= 0).any():
        raise ValueError("fit: every time_s must be > 0")
    (alpha, inv_beta), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    if alpha < 0:  # pure-bandwidth fit: latency below what the data can resolve
        alpha, inv_beta = 0.0, float(np.sum(a[:, 1] / t) / np.sum((a[:, 1] / t) ** 2))
    if inv_beta <= 0:
        raise ValueError("fit: time does not grow with message size, β cannot be fitted; measure larger sizes")
    return AlphaBeta(float(alpha), float(1.0 / inv_beta), name)


def run_collectives(world_size: int = 2, sizes_bytes: Sequence[int] = DEFAULT_SIZES, ops: Sequence[str] = OPS,
                    iters: int = 5, warmup: int = 1, backend: Optional[str] = None,
                    timeout_s: float = 300.0) -> dict[str, Any]:
    """Run the `scaling.engine.collectives` worker under torchrun on this host and return its JSON."""
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: a collective benchmark needs at least 2 ranks")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "collectives.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
               "-m", "scaling.engine.collectives", "--sizes", ",".join(map(str, sizes_bytes)), "--ops", ",".join(ops),
               "--iters", str(iters), "--warmup", str(warmup), "--out", str(out)]
        if backend:
            cmd += ["--backend", backend]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"collective benchmark exited {proc.returncode}: " + " | ".join(tail))
        return json.loads(out.read_text())


def measure(world_sizes: Sequence[int] = (2,), sizes_bytes: Sequence[int] = DEFAULT_SIZES, iters: int = 5,
            backend: Optional[str] = None) -> tuple[AlphaBeta, list[dict[str, Any]]]:
    """Benchmark the collectives at each world size and fit α-β to all of it."""
    runs = [run_collectives(n, sizes_bytes, iters=iters, backend=backend) for n in world_sizes]
    samples = [r for run in runs for r in run["results"]]
    name = f"{runs[0]['backend']} on {runs[0]['hostname']} (n={','.join(map(str, world_sizes))})"
    return fit(samples, name=name), samples


def save_profile(path: str | os.PathLike, ab: AlphaBeta, samples: list[dict[str, Any]]) -> Path:
    """Write a fitted profile (α, β and the samples behind it) as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**asdict(ab), "samples": samples}, indent=2))
    return path


def load_profile(path: str | os.PathLike) -> AlphaBeta:
    """Read a profile written by `save_profile`."""
    doc = json.loads(Path(path).read_text())
    return AlphaBeta(float(doc["alpha_s"]), float(doc["beta_bytes_per_s"]), doc.get("name", "fitted"))


def dp_comm_s(ab: AlphaBeta, zero_stage: int, dp: int, grad_bytes: float) -> float:
    """Gradient communication of one optimizer step: all-reduce (ZeRO 0/1), reduce-scatter + all-gather (2/3)."""
    if zero_stage in (0, 1):
        return ab.time_s("all_reduce", dp, grad_bytes)
    if zero_stage in (2, 3):
        return ab.time_s("reduce_scatter", dp, grad_bytes) + ab.time_s("all_gather", dp, grad_bytes)
    raise ValueError(f"zero_stage={zero_stage}: valid stages are 0, 1, 2, 3")


def extrapolate(measured: pd.DataFrame, ab: AlphaBeta, max_dp: int = 1024) -> pd.DataFrame:
    """Tokens/s per GPU vs dp for one configuration: measured points, then the α-β model up to max_dp.

    `measured` holds one row per dp of one configuration (a `dp_scaling.scaling_table` group) with
    dp, tokens_per_s_per_gpu, step_time_s, gbs_tokens, n_params, precision and zero_stage. The
    smallest dp's whole step time is taken as the compute of its tokens per rank (nothing is
    subtracted); every rank keeps that work per step and a step at dp ranks adds the gradient
    communication that dp costs beyond the smallest dp, with no overlap of the two.
    """
    if max_dp < 1:
        raise ValueError(f"max_dp={max_dp}: extrapolate to a dp >= 1")
    first = measured.sort_values("dp").iloc[0]
    dp0, zero_stage = int(first["dp"]), int(first["zero_stage"])
    tokens_per_rank = float(first["gbs_tokens"]) / dp0
    step0_s = float(first["step_time_s"])
    grad_bytes = float(first["n_params"]) * GRAD_BYTES.get(str(first["precision"]), 4)
    base_comm_s = dp_comm_s(ab, zero_stage, dp0, grad_bytes)
    powers = [2**k for k in range(max_dp.bit_length()) if dp0 <= 2**k <= max_dp]
    by_dp = measured.set_index(measured["dp"].astype(int))["tokens_per_s_per_gpu"]
    rows = []
    for dp in sorted(set(by_dp.index) | set(powers)):
        added_comm_s = dp_comm_s(ab, zero_stage, dp, grad_bytes) - base_comm_s
        model = tokens_per_rank / (step0_s + added_comm_s)
        is_measured = dp in by_dp.index
        rows.append({"dp": dp, "tokens_per_s_per_gpu": float(by_dp[dp]) if is_measured else model,
                     "model_tokens_per_s_per_gpu": model, "step0_s": step0_s, "added_comm_s": added_comm_s,
                     "source": "measured" if is_measured else "extrapolated"})
    out = pd.DataFrame(rows)
    out["efficiency"] = out["tokens_per_s_per_gpu"] / out["tokens_per_s_per_gpu"].iloc[0]
    return out


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m analysis.alpha_beta --out SWEEP_DIR/alpha_beta.json`: measure this host and save the fit."""
    p = argparse.ArgumentParser(prog="python -m analysis.alpha_beta", description=main.__doc__)
    p.add_argument("--out", required=True, help=f"profile JSON to write (the report reads <sweep_dir>/{PROFILE_FILE})")
    p.add_argument("--world-sizes", default="2", help="comma-separated rank counts, each >= 2")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None)
    args = p.parse_args(argv)
    ab, samples = measure([int(n) for n in args.world_sizes.split(",")], iters=args.iters, backend=args.backend)
    path = save_profile(args.out, ab, samples)
    print(f"α = {ab.alpha_s * 1e6:.1f} µs, β = {ab.beta_bytes_per_s / 1e9:.2f} GB/s ({ab.name}) -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
