"""Real CPU points held out: the step model fitted on part of a measured grid predicts the rest.

    python benchmarks/bench_grid_cpu.py [--steps 8]

One rank (one pinned thread) stands for one GPU; 2 ranks at most. A small built-in decoder (4 blocks, hidden 256,
seq 128, fp32) is measured once at each point of a grid: dp 1-2, tp 1-2, ZeRO 0-3, mbs 1-2, grad_acc 1-2 (`GRID`).
Fitted on `FIT` (one rank at both mbs and both grad_acc: a micro-step's compute per mbs and the optimizer per
parameter; dp=2 at ZeRO-0 (one gradient bucket) and ZeRO-3 (a gather and a reduce-scatter per module): the compute of
two ranks sharing the host over one rank's, and the cost per collective call; dp=1 × tp=2 at mbs 2: the cost per
tensor-parallel region, scaling.perf.call_cost) and the network's α-β from the collectives benchmark on the same two
ranks, each op's bytes term as measured there (scaling.perf.network.fit_op_scale); every other point predicted: its
nominal after and before (one α-β for every op, one rank's compute, no per-call cost), and a band of 400 draws (each launch's
timed steps resampled and the fit redone, the overlap drawn in [0, the schedule's bound] as no fitted point
identifies it, and the target's own scatter at the run-to-run prior, scaling.perf.extrapolation.RUN_TO_RUN).
Prints Markdown: coverage and median error over the held-out points; asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling.core.validate import validate
from scaling.job.run import derived_block, ranks_config
from scaling.model.family import family_of
from scaling.perf.call_cost import CallCost, calls_per_step, step_time_with_calls_s
from scaling.perf.extrapolation import RUN_TO_RUN
from scaling.perf.network import Network, fit_op_scale, fit_tiers
from scaling.perf.step_model import Workload, scheduled_overlap, step_time_s
from scaling.store.record import job_key
from scaling.sweep.compose import compose_config

SEQ = 128
POINT = [
    "model=small",
    "model.hidden=256",
    "model.n_heads=4",
    "model.n_kv_heads=4",
    "model.ffn_hidden=688",
    "model.n_layers=4",
    "logger=none",
    f"train.seq_len={SEQ}",
    "train.warmup_steps=1",
    "hardware.threads_per_device=1",
    "launch.timeout_s=600",
]
GRID = [
    # (dp, tp, zero, mbs, grad_acc)
    (1, 1, 0, 1, 1), (1, 1, 0, 1, 2), (1, 1, 0, 2, 1), (1, 1, 0, 2, 2),
    (2, 1, 0, 2, 1), (2, 1, 0, 1, 2), (2, 1, 1, 2, 1), (2, 1, 2, 2, 1), (2, 1, 2, 1, 2), (2, 1, 3, 2, 1),
    (2, 1, 3, 1, 2), (1, 2, 2, 2, 1), (1, 2, 2, 1, 1), (1, 2, 2, 2, 2), (1, 2, 3, 1, 2),
]  # fmt: skip
DP_FIT = ((2, 1, 0, 2, 1), (2, 1, 3, 2, 1))
FIT = {(1, 1, 0, 1, 1), (1, 1, 0, 1, 2), (1, 1, 0, 2, 1), (1, 1, 0, 2, 2), *DP_FIT, (1, 2, 2, 2, 1)}
"""The points the model is fitted on; the other eight are held out."""


def torchrun(ranks: int, module: list[str], port: int) -> None:
    """`python -m <module>` on `ranks` local ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--nnodes=1",
           "--master-addr=127.0.0.1", f"--master-port={port}", "-m", *module]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"torchrun on {ranks} ranks failed:\n{(out.stdout + out.stderr)[-3000:]}")


def overrides(point: tuple[int, int, int, int, int], steps: int) -> list[str]:
    """The config overrides of one grid point."""
    dp, tp, zero, mbs, ga = point
    return [*POINT, f"train.steps={steps}", f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.zero_stage={zero}",
            f"train.mbs={mbs}", f"train.grad_acc={ga}"]  # fmt: skip


def measure(work: Path, point: tuple[int, int, int, int, int], steps: int, port: int) -> tuple[float, ...]:
    """The timed steps of one launch of the point."""
    cfg = compose_config(overrides(point, steps))
    key = job_key(cfg)
    launch = work / key
    launch.mkdir()
    config = ranks_config(cfg, derived_block(cfg, validate(cfg)).to_dict(), key)
    (launch / "config.json").write_text(json.dumps(config))
    torchrun(point[0] * point[1], ["scaling.engine.worker", str(launch / "config.json")], port)
    return tuple(json.loads((launch / "worker.json").read_text())["step_times_s"])


@functools.cache
def workload(point: tuple[int, int, int, int, int]) -> Workload:
    """The step model's workload of one grid point."""
    dp, tp, zero, mbs, ga = point
    cfg = compose_config(overrides(point, 4))
    t, p = cfg.train, cfg.parallel
    return Workload(zero, family_of(cfg.model).shape(SEQ), str(t.precision), mbs, SEQ, None, ga,
                    str(p.fsdp_grad_reduce), str(t.recompute), float(t.grad_clip), float(p.bucket_mb), None, tp)  # fmt: skip


@functools.cache
def _calls(point: tuple[int, int, int, int, int]) -> tuple[int, int]:
    return calls_per_step(workload(point), point[0], point[4])


@dataclass(frozen=True)
class Fitted:
    """What the fitted points give."""

    compute: dict[int, float]
    """A micro-step's compute of one rank alone, by mbs."""
    optimizer: float
    """Seconds per parameter updated."""
    shared: float
    """A rank's compute when two ranks share the host, over one rank's alone (both cores busy)."""
    cost: CallCost


def fit(net: Network, t: dict[tuple[int, int, int, int, int], float], bare: Optional[CallCost] = None) -> Fitted:
    """From FIT: one rank's micro-step and optimizer from its two grad_acc at each mbs; the two-rank compute factor
    and the cost per collective call from dp=2 at ZeRO-0 (one bucket) and ZeRO-3 (a gather and a reduce-scatter per
    module): least squares, both at least 0; the cost per tensor-parallel region from the pair."""
    params = workload((1, 1, 0, 1, 1)).params_updated(1)
    compute = {m: max(t[1, 1, 0, m, 2] - t[1, 1, 0, m, 1], 1e-9) for m in (1, 2)}
    k = statistics.mean(max(t[1, 1, 0, m, 1] - compute[m], 0.0) / params for m in (1, 2))
    if bare is not None:  # the model before: one rank's compute, no per-call cost
        return Fitted(compute, k, 1.0, bare)
    rows, rest = [], []
    for pt in DP_FIT:
        dp, _, _, mbs, ga = pt
        rows.append((ga * compute[mbs], _calls(pt)[0]))
        rest.append(t[pt] - step_time_s(workload(pt), net, dp, 0.0, 0.0, k, ga))
    (shared, collective), *_ = np.linalg.lstsq(np.array(rows), np.array(rest), rcond=None)
    if collective < 0:
        shared, collective = float(np.dot(rest, [r[0] for r in rows]) / sum(r[0] ** 2 for r in rows)), 0.0
    shared = max(float(shared), 0.0)
    pair = (1, 2, 2, 2, 1)
    seconds = step_time_with_calls_s(workload(pair), net, 1, compute[2] / 2 * shared, 0.0, k, 1, CallCost(collective))
    return Fitted(compute, k, shared, CallCost(float(collective), max(t[pair] - seconds, 0.0) / _calls(pair)[1]))


def predict(
    net: Network, point: tuple[int, int, int, int, int], f: Fitted, cost: CallCost, overlap: float = 0.0
) -> float:
    """A point's step seconds: a rank's compute that of one rank at its mbs over tp (times the two-rank factor on
    two ranks), the optimizer, the per-call costs and the collectives by α-β, `overlap` of their hidden windows
    behind compute."""
    dp, tp, _, mbs, ga = point
    rank = f.compute[mbs] / tp * (f.shared if dp * tp > 1 else 1.0)
    return step_time_with_calls_s(workload(point), net, dp, rank, overlap, f.optimizer, ga, cost)


def main() -> None:
    """Measure the grid, fit on FIT, predict the rest, print."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps per launch (after one warm-up)")
    a = p.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs 2 cores: each rank pins one thread")
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out = work / "collectives.json"
        sizes = ",".join(str(s) for s in (16 * 2**10, 256 * 2**10, 2**20, 4 * 2**20))
        torchrun(2, ["scaling.engine.collective_bench", "--sizes", sizes, "--iters", "10", "--out", str(out)], 29810)
        samples = json.loads(out.read_text())["results"]
        plain = Network(fit_tiers(samples, None), None)
        net = replace(plain, op_scale=fit_op_scale(samples, plain))
        steps = {pt: measure(work, pt, a.steps, 29820 + i) for i, pt in enumerate(GRID)}
    wall = time.monotonic() - start
    med = {pt: statistics.median(v) for pt, v in steps.items()}
    fitted = fit(net, med)
    compute, k, cost = fitted.compute, fitted.optimizer, fitted.cost
    ab = net.tiers["intra_node"]
    print(f"Network on two ranks (collectives benchmark, gloo): α = {ab.alpha_s * 1e6:.0f} µs, β = "
          f"{ab.beta_bytes_per_s / 1e9:.2f} GB/s, each op's bytes term "
          f"{', '.join(f'{op} {x:.2f}' for op, x in net.op_scale)} (the model before: 1). Fitted on {len(FIT)} points: a micro-step {compute[1]:.3f} s "
          f"(mbs 1), {compute[2]:.3f} s (mbs 2); optimizer {k * 1e9:.2f} ns per parameter; two ranks' compute "
          f"{fitted.shared:.2f}× one rank's; "
          f"{cost.collective_s * 1e3:.2f} ms per collective call, {cost.tp_region_s * 1e3:.2f} ms per "
          f"tensor-parallel region.")  # fmt: skip
    print()
    print("| held out: dp, tp, ZeRO, mbs, grad_acc | measured s [range of timed steps] | before: one α-β, one rank's compute | error | "
          "after: each op's bytes term, two ranks' compute factor, per-call costs [95% band] | error | inside |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    rng, draws = random.Random(0), 400
    errors_before, errors_after, inside = [], [], 0
    held = [pt for pt in GRID if pt not in FIT]
    for pt in held:
        m = med[pt]
        before = predict(plain, pt, fit(plain, med, CallCost()), CallCost())
        after = predict(net, pt, fitted, cost)
        bound = scheduled_overlap(workload(pt), pt[0], pt[4])
        band = []
        for _ in range(draws):
            sample = {q: statistics.median(rng.choices(steps[q], k=len(steps[q]))) for q in FIT}
            again = fit(net, sample)
            band.append(predict(net, pt, again, again.cost, rng.uniform(0, bound)) * (1 + rng.gauss(0, RUN_TO_RUN)))
        band.sort()
        lo, hi = band[int(0.025 * draws)], band[int(0.975 * draws) - 1]
        ok = lo <= m <= hi
        inside += ok
        errors_before.append(before / m - 1)
        errors_after.append(after / m - 1)
        name = ", ".join(str(v) for v in pt)
        print(f"| {name} | {m:.3f} [{min(steps[pt]):.3f}, {max(steps[pt]):.3f}] | {before:.3f} | {before / m - 1:+.1%} "
              f"| {after:.3f} [{lo:.3f}, {hi:.3f}] | {after / m - 1:+.1%} | {'yes' if ok else 'no'} |")  # fmt: skip
    print()
    print(f"Held out: {len(held)} points; inside the band {inside} ({inside / len(held):.0%}); median |error| before "
          f"{statistics.median(abs(e) for e in errors_before):.1%}, after "
          f"{statistics.median(abs(e) for e in errors_after):.1%}; mean |error| after "
          f"{statistics.mean(abs(e) for e in errors_after):.1%}. Measured in {wall:.0f} s "
          f"({len(GRID)} launches); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end.")  # fmt: skip


if __name__ == "__main__":
    main()
