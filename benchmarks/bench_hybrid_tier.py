"""Hybrid against full sharding across an emulated slower tier, measured beside the step model's prediction.

    sudo python benchmarks/bench_hybrid_tier.py [--rate 400mbit] [--repeats 3] [--save FILE]
    python benchmarks/bench_hybrid_tier.py --replay FILE

On one host every ring is within a node, so the trade hybrid sharding makes (gathers within a node, the shards'
all-reduce across nodes) cannot show. Here two network namespaces stand for two nodes of 2 ranks each: ranks of one
namespace talk over its loopback, the two namespaces over a veth pair shaped with tc's token bucket (`--rate`). The
network's α-β figures per tier are measured there by the collectives benchmark (2 ranks in one namespace: the
intra-node tier; 2 + 2 across: the inter-node one), and each op's bytes term beside them (scaling.perf.network
.fit_op_scale: gloo's reduce-scatter moves more than a ring). The step model is fitted under that profile on the
same point within one namespace (dp=4, 4 ranks on its loopback, fitted as one node of 4: hybrid and full sharding
there cost the same, and its ranks share the host's cores as the points across do), and predicts dp=4 across both
namespaces (2 ranks per node) with full sharding and with dp_shard=2, with one α-β for every op, with each op's
factor, and with each op's factor on a node of one link (`hardware.links_per_node=1`: each namespace has one veth,
which hybrid sharding's two replica rings cross at once; scaling.perf.network.Network.flows), every FSDP2 call
exposed (gloo holds the host through it: `Workload.host_blocking`); the band: the fit's
draws with the target's scatter (the fitted point's launch-to-launch spread:
scaling.perf.extrapolation.launch_scatter). The three are measured, alternating, `--repeats` times each. Needs root
(ip netns, tc); `--save` keeps the collectives' samples and every launch's steps, `--replay` analyses them again
without root. Prints Markdown; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling.core.validate import validate
from scaling.job.run import derived_block, ranks_config
from scaling.model.family import family_of
from scaling.perf.call_cost import fit_collective_s
from scaling.perf.dp_fit import Fit
from scaling.perf.extrapolation import BAND, extrapolate, launch_scatter
from scaling.perf.network import NetworkEstimate, fit_op_scale, fit_tiers, sample_ring, tier_of
from scaling.perf.network_figures import Profile, profile_estimate
from scaling.perf.step_model import Point, Workload, host_blocking_backend, step_time_s
from scaling.store.record import job_key
from scaling.sweep.compose import compose_config

NODES = ("scaling-node0", "scaling-node1")
ADDRS = ("10.77.0.1", "10.77.0.2")
LINKS = ("veth-n0", "veth-n1")
MODEL = [
    "model=small",
    "model.hidden=512",
    "model.n_heads=8",
    "model.n_kv_heads=8",
    "model.ffn_hidden=1376",
    "model.n_layers=4",
]
"""About 15M parameters: 58 MB of fp32 state, whose gathers take seconds on the shaped link."""
POINT = [
    *MODEL,
    "logger=none",
    "train.seq_len=64",
    "train.mbs=2",
    "train.grad_acc=auto",
    "train.gbs=8",
    "train.warmup_steps=2",
    "train.steps=4",
    "parallel.zero_stage=3",
    "hardware.oversubscribe=true",
    "launch.timeout_s=600",
]


def sh(*cmd: str) -> None:
    """Run one set-up command; its failure stops the benchmark with its message."""
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def two_nodes(rate: str) -> Iterator[None]:
    """Two namespaces joined by a veth pair whose both ends are shaped to `rate` (removed on the way out)."""
    try:
        for ns in NODES:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", LINKS[0], "type", "veth", "peer", "name", LINKS[1])
        for ns, link, addr in zip(NODES, LINKS, ADDRS):
            sh("ip", "link", "set", link, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", link)
            sh("ip", "-n", ns, "link", "set", link, "up")
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", link, "root", "tbf", "rate", rate,
               "burst", "256kb", "latency", "2s")  # fmt: skip
        yield
    finally:
        for ns in NODES:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def torchrun(nodes: int, per_node: int, module: list[str], port: int) -> None:
    """`python -m <module>` on `per_node` ranks in each of the first `nodes` namespaces (one torchrun each)."""
    procs = []
    for rank in range(nodes):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": LINKS[rank], "OMP_NUM_THREADS": "1"}
        cmd = ["ip", "netns", "exec", NODES[rank], sys.executable, "-m", "torch.distributed.run",
               f"--nnodes={nodes}", f"--node-rank={rank}", f"--nproc-per-node={per_node}",
               f"--master-addr={ADDRS[0]}", f"--master-port={port}", "-m", *module]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"torchrun on {nodes}x{per_node} ranks failed:\n" + "\n".join(o[-3000:] for o in outs))


def network(work: Path) -> Profile:
    """α-β per tier on the two namespaces: 2 ranks within one, 2 + 2 across (devices_per_node 2)."""
    sizes = ",".join(str(s) for s in (64 * 2**10, 2**20, 4 * 2**20, 16 * 2**20))
    samples = []
    for nodes, per_node, port in ((1, 2, 29610), (2, 2, 29611)):
        out = work / f"collectives-{nodes}x{per_node}.json"
        module = ["scaling.engine.collective_bench", "--sizes", sizes, "--iters", "5", "--out", str(out)]
        torchrun(nodes, per_node, module, port)
        samples += json.loads(out.read_text())["results"]
    return Profile("two namespaces", 2, fit_tiers(samples, 2), tuple(samples))


def step_times(work: Path, nodes: int, per_node: int, extra: list[str], port: int) -> list[float]:
    """The timed steps of one point of dp = nodes × per_node ranks, its worker run in the namespaces."""
    dp = nodes * per_node
    cfg = compose_config([*POINT, f"parallel.dp={dp}", *extra, f"sweep_dir={work}"])
    launch = work / f"{job_key(cfg)}-{len(list(work.glob(job_key(cfg) + '*')))}"
    launch.mkdir()
    config = ranks_config(cfg, derived_block(cfg, validate(cfg, host=False)).to_dict(), job_key(cfg))
    (launch / "config.json").write_text(json.dumps(config))
    torchrun(nodes, per_node, ["scaling.engine.worker", str(launch / "config.json")], port)
    return json.loads((launch / "worker.json").read_text())["step_times_s"]


def workload(dp_shard: Optional[int]) -> Workload:
    """The points' step model (their config, a fixed global batch of 8)."""
    cfg = compose_config([*POINT, "parallel.dp=1"])
    t = cfg.train
    return Workload(3, family_of(cfg.model).shape(cfg.train.seq_len), str(t.precision), t.mbs, t.seq_len, 8, 1, str(cfg.parallel.fsdp_grad_reduce),
                    str(t.recompute), float(t.grad_clip), float(cfg.parallel.bucket_mb), dp_shard,
                    host_blocking=host_blocking_backend(cfg.hardware.backend))  # fmt: skip


def across(name: str, w: Workload, within: list[Point], source: NetworkEstimate) -> tuple[float, tuple[float, float]]:
    """dp=4 across both namespaces from the point within one: the step model fitted there as one node of 4 ranks
    (every ring on the loopback), its compute, optimizer and overlap then costed with 2 ranks per node; the nominal
    step and the BAND of the draws' steps (each with its network draw and the target's scatter)."""
    ex = extrapolate(
        name, w, within, 4, source, n_draws=len(source.draws), run_to_run=launch_scatter(p.step_times_s for p in within)
    )

    def step(f: Fit, scatter: float = 0.0) -> float:
        net = f.network.on_ring(2)
        return step_time_s(w, net, 4, f.compute_s, f.overlap, f.optimizer_s_per_param, 1) * (1 + scatter)

    steps = [step(d.fit, d.scatter) for d in ex.draws]
    lo, hi = (float(v) for v in np.percentile(steps, BAND))
    return step(ex.fit), (lo, hi)


def measure(rate: str, repeats: int) -> tuple[Profile, dict[str, list[float]]]:
    """The two namespaces' network profile and each point's timed-step medians, `repeats` launches each."""
    with tempfile.TemporaryDirectory() as tmp, two_nodes(rate):
        work = Path(tmp)
        profile = network(work)
        measured: dict[str, list[float]] = {"within": [], "full": [], "hybrid": []}
        for i in range(repeats):
            measured["within"].append(statistics.median(step_times(work, 1, 4, [], 29630 + 3 * i)))
            measured["full"].append(statistics.median(step_times(work, 2, 2, [], 29631 + 3 * i)))
            measured["hybrid"].append(statistics.median(step_times(work, 2, 2, ["parallel.dp_shard=2"], 29632 + 3 * i)))
    return profile, measured


def main() -> None:
    """Measure (or replay), fit, predict, print."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="400mbit", help="the inter-node link's rate (tc tbf)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--save", type=Path, help="write the collectives' samples and every launch's step median here")
    p.add_argument("--replay", type=Path, help="analyse a --save file (an earlier run) instead of measuring")
    a = p.parse_args()
    if a.replay is not None:
        saved = json.loads(a.replay.read_text())
        samples = saved["samples"]
        profile = Profile("two namespaces", 2, fit_tiers(samples, 2), tuple(samples))
        measured, rate, load = saved["measured"], saved["rate"], saved["load"]
        print(f"Replayed: {a.replay.name} ({saved.get('note', '')}).\n")
    else:
        load0 = os.getloadavg()[0]
        profile, measured = measure(a.rate, a.repeats)
        rate, load = a.rate, [load0, os.getloadavg()[0]]
        if a.save is not None:
            a.save.write_text(json.dumps({"samples": list(profile.samples), "measured": measured, "rate": rate,
                                          "load": load, "note": f"{a.repeats} launches per point at {rate}"}))  # fmt: skip
    print(f"inter-node link shaped to {rate}; measured tiers (devices_per_node 2):")
    for tier, ab in profile.tiers.items():
        alone = [q for q in profile.samples if tier_of(*sample_ring(q, 2)) == tier]
        per_call = fit_collective_s(alone) if tier == "intra_node" else None  # across: α within is taken off first
        calls = (
            f"; with a per-call cost: {per_call[0] * 1e6:.0f} µs per call, α = {per_call[1] * 1e6:.0f} µs"
            if per_call
            else ""
        )
        print(f"- {tier}: α = {ab.alpha_s * 1e6:.0f} µs, β = {ab.beta_bytes_per_s / 1e6:.0f} MB/s{calls}")
    rng = np.random.default_rng(0)
    source = profile_estimate(profile, 4, 200, rng)  # the fit's point: one node of 4 ranks
    scale = fit_op_scale(profile.samples, source.nominal.on_ring(2))
    print("- each op's bytes term over the α-β fit of all ops: " + ", ".join(f"{op} {k:.2f}" for op, k in scale))

    def variant(**changes: object) -> NetworkEstimate:
        return replace(
            source,
            nominal=replace(source.nominal, **changes),
            draws=tuple(replace(d, **changes) for d in source.draws),
        )

    scaled, linked = variant(op_scale=scale), variant(op_scale=scale, links_per_node=1)
    within = [Point(4, 1, tuple(measured["within"]))]
    print()
    print("| dp=4 across the link | measured step s (median [range] of repeats) | step model s [95% band], one "
          "α-β for every op | error | inside | with each op's bytes term as measured [95% band] | error | "
          "inside | and one link per node, shared by the rings that cross it at once [95% band] | error | inside |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    predicted: dict[str, dict[str, float]] = {}
    for name, shard in (("full", None), ("hybrid", 2)):
        w = workload(shard)
        m = measured[name]
        row = [f"{name} sharding{' (dp_shard=2)' if shard else ''}",
               f"{statistics.median(m):.2f} [{min(m):.2f}, {max(m):.2f}]"]  # fmt: skip
        for label, src in (("plain", source), ("scaled", scaled), ("linked", linked)):
            step, band = across(name, w, within, src)
            predicted.setdefault(label, {})[name] = step
            inside = band[0] <= statistics.median(m) <= band[1]
            row += [f"{step:.2f} [{band[0]:.2f}, {band[1]:.2f}]", f"{step / statistics.median(m) - 1:+.0%}",
                    "yes" if inside else "no"]  # fmt: skip
        print("| " + " | ".join(row) + " |")
    speedup = statistics.median(measured["full"]) / statistics.median(measured["hybrid"])
    print()
    w_in = measured["within"]
    ratios = ", ".join(f"{k} {v['full'] / v['hybrid']:.2f}×" for k, v in predicted.items())
    print(f"Hybrid over full sharding: measured {speedup:.2f}×, predicted {ratios} (one α-β; each op's factor; and "
          f"the shared link) (fitted on dp=4 within one namespace: {statistics.median(w_in):.2f} s "
          f"[{min(w_in):.2f}, {max(w_in):.2f}]; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end "
          f"on {os.cpu_count()} cores).")  # fmt: skip


if __name__ == "__main__":
    main()
