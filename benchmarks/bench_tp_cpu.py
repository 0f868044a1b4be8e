"""Tensor parallelism on CPU, measured beside the step model's prediction.

    python benchmarks/bench_tp_cpu.py [--repeats 3]

One rank (one pinned thread) stands for one GPU. A ~15M-parameter built-in decoder at ZeRO-2 runs on one rank
(dp=1, tp=1) and on two (dp=1, tp=2), at mbs 2 and mbs 1, each at grad_acc 1 and 2, the launches
alternating `--repeats` times. A step is grad_acc micro-steps of compute plus the optimizer: the two grad_acc of
one rank give a micro-step's compute and the optimizer's seconds per parameter. The step model predicts the tp=2
pair (at mbs 2; at mbs 1 from the mbs-1 rank alone) from them and the network's α-β, measured on the same two ranks by the collectives benchmark: the optimizer
over the half of each split matrix a rank holds, tensor parallelism's collectives exposed (scaling.perf.step_model
.tp_calls), and a rank's compute taken two ways: half the full micro-step's (matmuls split perfectly), and the
micro-step of half the tokens (mbs 1: the rule the recipe's predicted rows use for a tp rank). Then with the
per-call cost (scaling.perf.call_cost): the cost of one tensor-parallel region fitted on the pair at one mbs (the
same micro-step at tp 1 and 2) and the pair at the other mbs predicted with it, held out; its band the 2.5-97.5th
percentiles of 400 draws, each taking one launch of every (tp, mbs, grad_acc) at random and refitting, the share of
the pair's extra time that is per region rather than per token drawn uniform in [0, 1] (one mbs does not tell them
apart; the nominal charges all of it per region), times the held-out launch's own run-to-run scatter (the launches'
pooled relative spread). The collectives benchmark's
per-call cost beside α, where its two ops tell them apart. Prints Markdown; asserts nothing.
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
from pathlib import Path

from scaling.core.validate import validate
from scaling.job.run import derived_block, ranks_config
from scaling.model.family import family_of
from scaling.perf.call_cost import CallCost, fit_collective_s, fit_tp_region_s, step_time_with_calls_s
from scaling.perf.network import AlphaBeta, Network, fit_tiers
from scaling.perf.step_model import Workload, host_blocking_backend, step_collectives, step_time_s
from scaling.store.record import job_key
from scaling.sweep.compose import compose_config

MODEL = [
    "model=small",
    "model.hidden=512",
    "model.n_heads=8",
    "model.n_kv_heads=8",
    "model.ffn_hidden=1376",
    "model.n_layers=4",
]
"""About 15M parameters; every width divides by 2."""
SEQ = 256
POINT = [
    *MODEL,
    "logger=none",
    f"train.seq_len={SEQ}",
    "train.warmup_steps=2",
    "train.steps=4",
    "parallel.zero_stage=2",
    "hardware.threads_per_device=1",
    "launch.timeout_s=600",
]
LAUNCHES = [(1, 2, 1), (1, 2, 2), (1, 1, 1), (1, 1, 2), (2, 2, 1), (2, 2, 2), (2, 1, 1), (2, 1, 2)]
"""(tp, mbs, grad_acc) of each launch of a repeat, in the order run."""


def torchrun(ranks: int, module: list[str], port: int) -> None:
    """`python -m <module>` on `ranks` local ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--nnodes=1",
           "--master-addr=127.0.0.1", f"--master-port={port}", "-m", *module]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"torchrun on {ranks} ranks failed:\n{(out.stdout + out.stderr)[-3000:]}")


def network(work: Path) -> tuple[Network, list[dict]]:
    """α-β within a node from the collectives benchmark on two ranks, and its samples."""
    out = work / "collectives.json"
    sizes = ",".join(str(s) for s in (16 * 2**10, 256 * 2**10, 2**20, 4 * 2**20))
    torchrun(2, ["scaling.engine.collective_bench", "--sizes", sizes, "--iters", "10", "--out", str(out)], 29710)
    samples = json.loads(out.read_text())["results"]
    return Network(fit_tiers(samples, None), None), samples


def step_time(work: Path, tp: int, mbs: int, grad_acc: int, port: int) -> float:
    """Median of the timed steps of one launch of dp=1 × tp ranks."""
    cfg = compose_config([*POINT, f"parallel.tp={tp}", f"train.mbs={mbs}", f"train.grad_acc={grad_acc}"])
    key = job_key(cfg)
    launch = work / f"{key}-{len(list(work.glob(key + '*')))}"
    launch.mkdir()
    config = ranks_config(cfg, derived_block(cfg, validate(cfg)).to_dict(), key)
    (launch / "config.json").write_text(json.dumps(config))
    torchrun(tp, ["scaling.engine.worker", str(launch / "config.json")], port)
    return statistics.median(json.loads((launch / "worker.json").read_text())["step_times_s"])


@functools.cache
def workload(tp: int, mbs: int, grad_acc: int) -> Workload:
    """The step model's workload of one launch."""
    cfg = compose_config([*POINT, f"parallel.tp={tp}", f"train.mbs={mbs}", f"train.grad_acc={grad_acc}"])
    t = cfg.train
    return Workload(2, family_of(cfg.model).shape(cfg.train.seq_len), str(t.precision), mbs, SEQ, None, grad_acc, str(cfg.parallel.fsdp_grad_reduce),
                    str(t.recompute), float(t.grad_clip), float(cfg.parallel.bucket_mb), None, tp,
                    host_blocking=host_blocking_backend(cfg.hardware.backend))  # fmt: skip


def split(one: float, two: float, params: int) -> tuple[float, float]:
    """(a micro-step's compute, the optimizer's seconds per parameter) from the steps at grad_acc 1 and 2."""
    compute = two - one
    return compute, max(one - compute, 0.0) / params


def per_step_comm(net: Network, mbs: int, grad_acc: int) -> float:
    """Seconds of the pair's collectives in one step by the α-β figures, nothing hidden."""
    calls = step_collectives(workload(2, mbs, grad_acc), 1, grad_acc)
    return sum(c.count * net.time_s(c.op, 2, c.bytes_per_call) for c in calls)


def spread(values: list[float]) -> str:
    """Median [min, max]."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def held_out(
    net: Network, med: dict[tuple[int, int, int], float], fit_mbs: int, mbs: int, ga: int, fixed: float = 1.0
) -> float:
    """The pair's step at (mbs, ga) predicted from the pair at fit_mbs: a rank's compute half one rank's micro-step,
    the optimizer from one rank's two grad_acc, and the time the pair took beyond them at fit_mbs charged a `fixed`
    share per tensor-parallel region (scaling.perf.call_cost) and the rest in proportion to the compute (one mbs
    cannot tell the two apart)."""
    whole = workload(1, 2, 1)
    compute = {m: split(med[1, m, 1], med[1, m, 2], whole.params_updated(1)) for m in (2, 1)}
    k = (compute[2][1] + compute[1][1]) / 2
    regions, ratios = [], []
    for g in (1, 2):  # the fitting mbs's two launches of the pair
        w = workload(2, fit_mbs, g)
        unaccounted = med[2, fit_mbs, g] - step_time_s(w, net, 1, compute[fit_mbs][0] / 2, 0.0, k, g)
        regions.append(fit_tp_region_s(fixed * unaccounted, w, 1, g))
        ratios.append((1 - fixed) * unaccounted / (g * compute[fit_mbs][0] / 2))
    cost = CallCost(tp_region_s=statistics.mean(regions))
    rank = compute[mbs][0] / 2 * (1 + statistics.mean(ratios))
    return step_time_with_calls_s(workload(2, mbs, ga), net, 1, rank, 0.0, k, ga, cost)


def with_calls(net: Network, samples: list[dict], measured: dict[tuple[int, int, int], list[float]]) -> None:
    """The pair predicted with the per-call cost fitted on the other mbs: nominal, band, error before and after."""
    fitted = fit_collective_s(samples)
    ab = net.tiers["intra_node"]
    if not samples:
        print("No collectives benchmark samples recorded: the per-call cost of a collective not fitted.")
    elif fitted is None:
        print("Collectives benchmark: a per-call cost and α do not tell apart on these samples.")
    else:
        c, alpha, inv_beta = fitted
        print(f"Collectives benchmark with a per-call cost: {c * 1e6:.0f} µs per call, α = {alpha * 1e6:.0f} µs, "
              f"β = {1 / inv_beta / 1e9:.2f} GB/s (α alone: {ab.alpha_s * 1e6:.0f} µs).")  # fmt: skip
    med = {key: statistics.median(v) for key, v in measured.items()}
    scatter = statistics.pstdev([t / med[key] - 1 for key, v in measured.items() for t in v])
    rng, draws = random.Random(0), 400
    print()
    print("| dp=1 × tp=2, held out | measured s | before: half the micro-step, no per-call cost | error | "
          "after: a region's cost fitted on the other mbs [95% band] | error | inside |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    whole = workload(1, 2, 1)
    for mbs, fit_mbs in ((2, 1), (1, 2)):
        for ga in (1, 2):
            m = med[2, mbs, ga]
            full, k_full = split(med[1, 2, 1], med[1, 2, 2], whole.params_updated(1))
            half, k_half = split(med[1, 1, 1], med[1, 1, 2], whole.params_updated(1))
            before = step_time_s(workload(2, mbs, ga), net, 1, (full if mbs == 2 else half) / 2, 0.0,
                                 (k_full + k_half) / 2, ga)  # fmt: skip
            after = held_out(net, med, fit_mbs, mbs, ga)
            band = sorted(
                held_out(net, {key: rng.choice(v) for key, v in measured.items()}, fit_mbs, mbs, ga, rng.random())
                * (1 + rng.gauss(0, scatter))
                for _ in range(draws)
            )
            lo, hi = band[int(0.025 * draws)], band[int(0.975 * draws) - 1]
            print(f"| mbs {mbs}, grad_acc {ga} (fitted on mbs {fit_mbs}) | {spread(measured[2, mbs, ga])} | "
                  f"{before:.3f} | {before / m - 1:+.0%} | {after:.3f} [{lo:.3f}, {hi:.3f}] | {after / m - 1:+.1%} | "
                  f"{'yes' if lo <= m <= hi else 'no'} |")  # fmt: skip
    print()
    print(f"Run-to-run scatter of a launch (pooled over the launches): {scatter:.1%}.")


def main() -> None:
    """Measure, predict, print."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--save", type=Path, help="write the network and every launch's step time to this JSON")
    p.add_argument("--replay", type=Path, help="analyse a --save file (an earlier run) instead of measuring")
    a = p.parse_args()
    if a.replay is not None:
        saved = json.loads(a.replay.read_text())
        net = Network({"intra_node": AlphaBeta(saved["alpha_s"], saved["beta_bytes_per_s"])}, None)
        samples = saved.get("samples", [])
        measured = {tuple(int(v) for v in k.split(",")): list(t) for k, t in saved["measured"].items()}
        a.repeats = min(len(t) for t in measured.values())
        print(f"Replayed: {a.replay.name} ({saved.get('note', '')}).\n")
    else:
        if (os.cpu_count() or 1) < 2:
            raise SystemExit("needs 2 cores: each rank pins one thread")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            net, samples = network(work)
            measured = {k: [] for k in LAUNCHES}
            for i in range(a.repeats):
                for j, (tp, mbs, ga) in enumerate(LAUNCHES):
                    measured[tp, mbs, ga].append(step_time(work, tp, mbs, ga, 29720 + 10 * i + j))
        if a.save is not None:
            ab = net.tiers["intra_node"]
            a.save.write_text(json.dumps({"alpha_s": ab.alpha_s, "beta_bytes_per_s": ab.beta_bytes_per_s,
                                          "samples": samples, "measured": {",".join(map(str, k)): v
                                                                           for k, v in measured.items()}}, indent=1))  # fmt: skip
    ab = net.tiers["intra_node"]
    med = {k: statistics.median(v) for k, v in measured.items()}
    whole = workload(1, 2, 1)
    full_compute, k_full = split(med[1, 2, 1], med[1, 2, 2], whole.params_updated(1))
    half_compute, k_half = split(med[1, 1, 1], med[1, 1, 2], whole.params_updated(1))
    k = (k_full + k_half) / 2
    print(f"Network on two ranks (collectives benchmark, gloo): α = {ab.alpha_s * 1e6:.0f} µs, "
          f"β = {ab.beta_bytes_per_s / 1e9:.2f} GB/s. Step seconds: median [range] of {a.repeats} launches.")  # fmt: skip
    print()
    print("| launch | grad_acc 1 | grad_acc 2 | a micro-step's compute |")
    print("|---|---|---|---|")
    pair = {mbs: split(med[2, mbs, 1], med[2, mbs, 2], workload(2, mbs, 1).params_updated(1))[0] for mbs in (2, 1)}
    for (tp, mbs), compute in (((1, 2), full_compute), ((1, 1), half_compute), ((2, 2), pair[2]), ((2, 1), pair[1])):
        name = f"dp=1 × tp={tp}, mbs {mbs}"
        print(f"| {name} | {spread(measured[tp, mbs, 1])} | {spread(measured[tp, mbs, 2])} | {compute:.3f} s |")
    print()
    print(f"Optimizer: {k * 1e9:.2f} ns per parameter ({whole.n_params:,} parameters, {whole.params_updated(1):,} "
          "updated at tp=1).")  # fmt: skip
    print()
    print("| dp=1 × tp=2 | measured s | predicted s, compute = half the micro-step of one rank | error | "
          "predicted s, compute = one rank's micro-step of half the tokens (the recipe's rule) | error |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    rules = {2: (full_compute / 2, half_compute), 1: (half_compute / 2, None)}
    for mbs in (2, 1):
        for ga in (1, 2):
            w = workload(2, mbs, ga)
            m = med[2, mbs, ga]
            row = [f"mbs {mbs}, grad_acc {ga}", spread(measured[2, mbs, ga])]
            for compute in rules[mbs]:
                s = step_time_s(w, net, 1, compute, 0.0, k, ga) if compute is not None else None
                row += [f"{s:.3f}", f"{s / m - 1:+.0%}"] if s is not None else ["–", "–"]
            print("| " + " | ".join(row) + " |")
    print()
    for mbs in (2, 1):
        comm = per_step_comm(net, mbs, 2) - per_step_comm(net, mbs, 1)  # a micro-step's
        one = full_compute if mbs == 2 else half_compute
        print(f"- mbs {mbs}: a micro-step of the pair {pair[mbs]:.3f} s against half of one rank's {one / 2:.3f} s and "
              f"tensor parallelism's collectives {comm:.3f} s by the α-β figures: {pair[mbs] - one / 2 - comm:+.3f} s "
              f"unaccounted per micro-step; tokens/s per GPU {mbs * SEQ * 2 / 2 / med[2, mbs, 2]:,.0f} against one "
              f"rank's {mbs * SEQ * 2 / med[1, mbs, 2]:,.0f} at grad_acc 2.")  # fmt: skip
    print()
    with_calls(net, samples, measured)
    print()
    if a.replay is None:
        print(f"Load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end.")


if __name__ == "__main__":
    main()
