"""Real CPU points held out: the step model fitted on part of a measured grid predicts the rest.

    python benchmarks/bench_grid_cpu.py [--steps 8] [--launches 2] [--save FILE | --replay FILE]

One rank (one pinned thread) stands for one GPU; 2 ranks at most. A small built-in decoder (4 blocks, hidden 256,
seq 128, fp32) is measured once at each point of a grid: dp 1-2, tp 1-2, ZeRO 0-3, mbs 1-2, grad_acc 1-2 (`GRID`).
Fitted on `FIT` (one rank at both mbs and both grad_acc: a micro-step's compute per mbs and the optimizer per
parameter; dp=2 at ZeRO-0 (one gradient bucket) and ZeRO-3 (a gather and a reduce-scatter per module): the compute of
two ranks sharing the host over one rank's, and the cost of a sharded module's call; dp=1 × tp=2 at mbs 2: the cost
per tensor-parallel region, scaling.perf.call_cost) and the network's α-β from the collectives benchmark on the same
two ranks, each op's bytes term as measured there (scaling.perf.network.fit_op_scale). A plain call on one tensor
(DDP's bucket, ZeRO-1's broadcast of each parameter) costs what that benchmark timed for such a call, no more. Every
other point predicted: its nominal after, with every call charged alike (the model before calls were told apart)
and before (one α-β for every op, one rank's compute, no per-call cost), and a band of 400 draws (each point's
launches and each launch's timed steps resampled and the fit redone, the overlap drawn in [0, the schedule's bound]
and a plain call's cost beyond α in [0, a module's call's] as no fitted point identifies them, and the target's own
scatter: the launches' pooled launch-to-launch spread, at
least scaling.perf.extrapolation.RUN_TO_RUN). Each point is launched `--launches` times, the grid in turn, so a
drift of the host's speed falls on every point alike; a point's figure is the median of its launches' medians.
`--save` keeps every launch's step times and the collectives' samples; `--replay` analyses such a file again.
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
from scaling.perf.call_cost import CallCost, call_counts, step_time_with_calls_s
from scaling.perf.extrapolation import launch_scatter
from scaling.perf.network import Network, fit_op_scale, fit_tiers
from scaling.perf.step_model import Workload, host_blocking_backend, scheduled_overlap, step_time_s
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
    launch.mkdir(parents=True)
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
                    str(p.fsdp_grad_reduce), str(t.recompute), float(t.grad_clip), float(p.bucket_mb), None, tp,
                    host_blocking=host_blocking_backend(cfg.hardware.backend))  # fmt: skip


@functools.cache
def _calls(point: tuple[int, int, int, int, int]) -> tuple[int, int, int]:
    return call_counts(workload(point), point[0], point[4])


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


def fit(
    net: Network, t: dict[tuple[int, int, int, int, int], float], bare: Optional[CallCost] = None, alike: bool = False
) -> Fitted:
    """From FIT: one rank's micro-step and optimizer from its two grad_acc at each mbs; the two-rank compute factor
    and the cost of a sharded module's call from dp=2 at ZeRO-0 (one plain bucket call) and ZeRO-3 (a gather and a
    reduce-scatter per module): least squares, both at least 0; the cost per tensor-parallel region from the pair.
    `alike`: every data-parallel call charged the one fitted cost (plain calls too)."""
    params = workload((1, 1, 0, 1, 1)).params_updated(1)
    compute = {m: max(t[1, 1, 0, m, 2] - t[1, 1, 0, m, 1], 1e-9) for m in (1, 2)}
    k = statistics.mean(max(t[1, 1, 0, m, 1] - compute[m], 0.0) / params for m in (1, 2))
    if bare is not None:  # the model before: one rank's compute, no per-call cost
        return Fitted(compute, k, 1.0, bare)
    rows, rest = [], []
    for pt in DP_FIT:
        dp, _, _, mbs, ga = pt
        module, plain, _ = _calls(pt)
        rows.append((ga * compute[mbs], module + plain if alike else module))
        rest.append(t[pt] - step_time_s(workload(pt), net, dp, 0.0, 0.0, k, ga))
    (shared, collective), *_ = np.linalg.lstsq(np.array(rows), np.array(rest), rcond=None)
    if collective < 0:
        shared, collective = float(np.dot(rest, [r[0] for r in rows]) / sum(r[0] ** 2 for r in rows)), 0.0
    shared = max(float(shared), 0.0)
    calls = CallCost(float(collective), plain_call_s=float(collective) if alike else 0.0)
    pair = (1, 2, 2, 2, 1)
    seconds = step_time_with_calls_s(workload(pair), net, 1, compute[2] / 2 * shared, 0.0, k, 1, calls)
    return Fitted(compute, k, shared, replace(calls, tp_region_s=max(t[pair] - seconds, 0.0) / _calls(pair)[2]))


def predict(
    net: Network, point: tuple[int, int, int, int, int], f: Fitted, cost: CallCost, overlap: float = 0.0
) -> float:
    """A point's step seconds: a rank's compute that of one rank at its mbs over tp (times the two-rank factor on
    two ranks), the optimizer, the per-call costs and the collectives by α-β, `overlap` of their hidden windows
    behind compute."""
    dp, tp, _, mbs, ga = point
    rank = f.compute[mbs] / tp * (f.shared if dp * tp > 1 else 1.0)
    return step_time_with_calls_s(workload(point), net, dp, rank, overlap, f.optimizer, ga, cost)


Launches = dict[tuple[int, int, int, int, int], list[tuple[float, ...]]]


def measure_grid(launches: int, steps: int) -> tuple[list[dict], Launches, float]:
    """The collectives benchmark's samples on two ranks, every point's launches (the grid in turn, `launches`
    times) and the seconds it all took."""
    start = time.monotonic()
    measured: Launches = {pt: [] for pt in GRID}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out = work / "collectives.json"
        sizes = ",".join(str(s) for s in (16 * 2**10, 256 * 2**10, 2**20, 4 * 2**20))
        torchrun(2, ["scaling.engine.collective_bench", "--sizes", sizes, "--iters", "10", "--out", str(out)], 29810)
        samples = json.loads(out.read_text())["results"]
        for turn in range(launches):
            for i, pt in enumerate(GRID):
                measured[pt].append(measure(work / str(turn), pt, steps, 29820 + i))
    return samples, measured, time.monotonic() - start


def figure(runs: list[tuple[float, ...]]) -> float:
    """A point's step seconds: the median of its launches' medians."""
    return statistics.median(statistics.median(r) for r in runs)


def main() -> None:
    """Measure the grid (or replay a saved one), fit on FIT, predict the rest, print."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps per launch (after one warm-up)")
    p.add_argument("--launches", type=int, default=2, help="launches of each point (the grid in turn)")
    p.add_argument("--save", type=Path, help="write the collectives' samples and every launch's step times here")
    p.add_argument("--replay", type=Path, help="analyse a --save file (an earlier run) instead of measuring")
    a = p.parse_args()
    if a.replay is not None:
        saved = json.loads(a.replay.read_text())
        samples, wall, load = saved["samples"], saved["wall_s"], saved["load"]
        measured = {
            tuple(int(v) for v in k.split(",")): [tuple(r) for r in runs] for k, runs in saved["measured"].items()
        }
        print(f"Replayed: {a.replay.name} ({saved.get('note', '')}).\n")
    else:
        if (os.cpu_count() or 1) < 2:
            raise SystemExit("needs 2 cores: each rank pins one thread")
        load0 = os.getloadavg()[0]
        samples, measured, wall = measure_grid(a.launches, a.steps)
        load = [load0, os.getloadavg()[0]]
        if a.save is not None:
            a.save.write_text(json.dumps({"samples": samples, "wall_s": wall, "load": load, "steps": a.steps,
                                          "measured": {",".join(map(str, k)): v for k, v in measured.items()},
                                          "note": f"{a.launches} launches of {a.steps} timed steps per point"}))  # fmt: skip
    plain = Network(fit_tiers(samples, None), None)
    net = replace(plain, op_scale=fit_op_scale(samples, plain))
    med = {pt: figure(runs) for pt, runs in measured.items()}
    scatter = launch_scatter([statistics.median(r) for r in runs] for runs in measured.values())
    fitted, alike = fit(net, med), fit(net, med, alike=True)
    compute, k, cost = fitted.compute, fitted.optimizer, fitted.cost
    ab = net.tiers["intra_node"]
    print(f"Network on two ranks (collectives benchmark, gloo): α = {ab.alpha_s * 1e6:.0f} µs, β = "
          f"{ab.beta_bytes_per_s / 1e9:.2f} GB/s, each op's bytes term "
          f"{', '.join(f'{op} {x:.2f}' for op, x in net.op_scale)} (the model before: 1). Fitted on {len(FIT)} points: a micro-step {compute[1]:.3f} s "
          f"(mbs 1), {compute[2]:.3f} s (mbs 2); optimizer {k * 1e9:.2f} ns per parameter; two ranks' compute "
          f"{fitted.shared:.2f}× one rank's; "
          f"{cost.collective_s * 1e3:.2f} ms per sharded module's call ({alike.cost.collective_s * 1e3:.2f} ms per "
          f"call with every call alike), {cost.tp_region_s * 1e3:.2f} ms per tensor-parallel region. "
          f"Launch-to-launch scatter (pooled): {scatter:.1%}.")  # fmt: skip
    print()
    print("| held out: dp, tp, ZeRO, mbs, grad_acc | measured s [launches' medians] | before: one α-β, one rank's compute | error | "
          "every call alike | error | after: a module's call and a plain call apart [95% band] | error | inside |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    rng, draws = random.Random(0), 400
    errors_before, errors_alike, errors_after, inside = [], [], [], 0
    held = [pt for pt in GRID if pt not in FIT]
    for pt in held:
        m = med[pt]
        before = predict(plain, pt, fit(plain, med, CallCost()), CallCost())
        same = predict(net, pt, alike, alike.cost)
        after = predict(net, pt, fitted, cost)
        bound = scheduled_overlap(workload(pt), pt[0], pt[4])
        band = []
        for _ in range(draws):
            sample = {
                q: statistics.median(
                    statistics.median(rng.choices(r, k=len(r))) for r in rng.choices(measured[q], k=len(measured[q]))
                )
                for q in FIT
            }
            again = fit(net, sample)
            drawn = replace(again.cost, plain_call_s=rng.uniform(0, again.cost.collective_s))
            band.append(predict(net, pt, again, drawn, rng.uniform(0, bound)) * (1 + rng.gauss(0, scatter)))
        band.sort()
        lo, hi = band[int(0.025 * draws)], band[int(0.975 * draws) - 1]
        ok = lo <= m <= hi
        inside += ok
        errors_before.append(before / m - 1)
        errors_alike.append(same / m - 1)
        errors_after.append(after / m - 1)
        name = ", ".join(str(v) for v in pt)
        runs = ", ".join(f"{statistics.median(r):.3f}" for r in measured[pt])
        print(f"| {name} | {m:.3f} [{runs}] | {before:.3f} | {before / m - 1:+.1%} | {same:.3f} | {same / m - 1:+.1%} "
              f"| {after:.3f} [{lo:.3f}, {hi:.3f}] | {after / m - 1:+.1%} | {'yes' if ok else 'no'} |")  # fmt: skip
    print()
    launches = sum(len(r) for r in measured.values())
    print(f"Held out: {len(held)} points; inside the band {inside} ({inside / len(held):.0%}); median |error| before "
          f"{statistics.median(abs(e) for e in errors_before):.1%}, every call alike "
          f"{statistics.median(abs(e) for e in errors_alike):.1%}, after "
          f"{statistics.median(abs(e) for e in errors_after):.1%}; mean |error| after "
          f"{statistics.mean(abs(e) for e in errors_after):.1%}. Measured in {wall:.0f} s "
          f"({launches} launches); load average {load[0]:.1f} at the start, {load[1]:.1f} at the end on 2 cores.")  # fmt: skip


if __name__ == "__main__":
    main()
