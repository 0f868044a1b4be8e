"""α-β model: ring costs, per-tier fits, the three sources of network figures, and `scaling collectives`
run for real (torchrun here; srun + torchrun across two nodes of the test SLURM cluster)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scaling.cli.collectives import main
from scaling.engine.collective_bench import OPS, bus_factor, parse_args
from scaling.engine.jobfiles import CONFIG_FILE, TORCHRUN_LOG
from scaling.launch.network_probe import BENCH_DIR, BENCH_OUTPUT, world_sizes
from scaling.perf.network import (
    INTER,
    INTRA,
    AlphaBeta,
    Network,
    fit,
    fit_tiers,
    latency_steps,
    ring_cost,
    sample_ring,
)
from scaling.perf.network_figures import (
    PROFILE_FILE,
    Profile,
    load_profile,
    profile_estimate,
    published,
    published_estimate,
    save_profile,
    with_fallback,
)

REPO = Path(__file__).resolve().parents[1]


def test_ring_costs():
    assert ring_cost("all_reduce", 4, 1000) == (6, 1500.0)
    assert ring_cost("reduce_scatter", 4, 1000) == (3, 750.0)
    assert ring_cost("all_gather", 8, 800) == (7, 700.0)
    assert ring_cost("all_reduce", 1, 1000) == (0, 0.0)
    assert ring_cost("broadcast", 4, 1000) == (3, 1000.0)  # a pipelined ring: S over every link, n-1 hops
    with pytest.raises(ValueError, match="op='all_to_all' is not a collective of the model"):
        ring_cost("all_to_all", 2, 1)
    assert bus_factor("all_reduce", 4) == 1.5 and bus_factor("all_gather", 4) == 0.75


def test_a_ring_across_nodes_pays_the_inter_node_latency_at_its_node_crossings_only():
    """NCCL's ring latency (src/graph/tuning.cc): over N nodes, 2(N−1) of an all-reduce's 2(n−1) steps cross
    between nodes, N−1 of a reduce-scatter's, an all-gather's or a broadcast's n−1; the rest stay within a node.
    The bytes move at the slowest tier's β. One node, or no node boundary (CPU): every step within it."""
    assert latency_steps("all_reduce", 128, 8) == {INTRA: 2 * 127 - 2 * 15, INTER: 2 * 15}  # 16 nodes
    assert latency_steps("reduce_scatter", 128, 8) == latency_steps("all_gather", 128, 8) == {INTRA: 112, INTER: 15}
    assert latency_steps("broadcast", 16, 8) == {INTRA: 14, INTER: 1}
    assert latency_steps("all_reduce", 16, 8) == {INTRA: 28, INTER: 2}  # two nodes of 8: 30 steps, 2 cross
    assert latency_steps("reduce_scatter", 16, 8) == {INTRA: 14, INTER: 1}
    assert latency_steps("all_reduce", 12, 8) == {INTRA: 20, INTER: 2}  # 8 + 4 ranks: two nodes
    assert latency_steps("all_gather", 16, 1) == {INTRA: 0, INTER: 15}  # one rank per node: every step crosses
    assert latency_steps("all_reduce", 8, 8) == latency_steps("all_reduce", 8, None) == {INTRA: 14}
    intra, inter = AlphaBeta(3e-6, 360e9), AlphaBeta(12e-6, 40e9)
    net = Network({INTRA: intra, INTER: inter}, 8)
    assert net.time_s("all_reduce", 128, 2**30) == pytest.approx(224 * 3e-6 + 30 * 12e-6 + 2 * 127 / 128 * 2**30 / 40e9)
    assert net.time_s("broadcast", 16, 2**20) == pytest.approx(14 * 3e-6 + 12e-6 + 2**20 / 40e9)
    assert net.time_s("all_reduce", 8, 2**20) == pytest.approx(14 * 3e-6 + 7 / 4 * 2**20 / 360e9)
    assert Network({INTRA: intra}, None).time_s("all_reduce", 128, 2**20) == pytest.approx(
        254 * 3e-6 + 2 * 127 / 128 * 2**20 / 360e9
    )
    assert net.time_s("all_reduce", 16, 2**20) == pytest.approx(28 * 3e-6 + 2 * 12e-6 + 15 / 8 * 2**20 / 40e9)
    assert net.time_s("all_reduce", 1, 2**20) == 0.0 and Network({INTER: inter}, 1).time_s("all_reduce", 1, 1.0) == 0.0
    assert Network({INTER: inter}, 1).reaches(16) and not Network({INTER: inter}, 8).reaches(16)
    with pytest.raises(ValueError, match=r"dp=16: the network has no figures for its tier \(intra_node\)"):
        Network({INTER: inter}, 8).time_s("all_gather", 16, 1.0)


def _samples(truth: dict[str, AlphaBeta], dpn, world_sizes_, rng, noise=0.03):
    out, net = [], Network(truth, dpn)
    for n in world_sizes_:
        for op in OPS:
            for s in (1024, 64 * 1024, 2**20, 16 * 2**20, 256 * 2**20):
                times = [net.time_s(op, n, s) * (1 + rng.gauss(0, noise)) for _ in range(5)]
                out.append(
                    {"op": op, "world_size": n, "size_bytes": s, "time_s": float(np.median(times)), "times_s": times}
                )
    return out


@pytest.mark.parametrize("alpha_s, beta", [(30e-6, 25e9), (2e-3, 0.5e9)])
def test_fit_recovers_alpha_and_beta_within_5_percent(alpha_s, beta):
    samples = _samples({INTRA: AlphaBeta(alpha_s, beta)}, None, (2, 4, 8), random.Random(0))
    got = fit(samples)
    assert got.alpha_s == pytest.approx(alpha_s, rel=0.05)
    assert got.beta_bytes_per_s == pytest.approx(beta, rel=0.05)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="at least two sizes"):
        fit([{"op": "all_reduce", "world_size": 2, "size_bytes": 1024, "time_s": 1e-3}])


def test_each_tier_is_fitted_from_its_own_world_sizes():
    """Launches within a node fit the NVLink-like tier; launches spanning nodes the slower one, from their node
    crossings (their steps within a node paid at the first tier's α): both keep the meaning of one ring step's
    latency and the bus bandwidth of their tier."""
    truth = {INTRA: AlphaBeta(3e-6, 300e9), INTER: AlphaBeta(15e-6, 40e9)}
    samples = _samples(truth, 8, (2, 4, 8, 16, 32), random.Random(1))
    tiers = fit_tiers(samples, devices_per_node=8)
    for tier in (INTRA, INTER):
        assert tiers[tier].alpha_s == pytest.approx(truth[tier].alpha_s, rel=0.1)
        assert tiers[tier].beta_bytes_per_s == pytest.approx(truth[tier].beta_bytes_per_s, rel=0.05)
    exact = fit_tiers(_samples(truth, 8, (2, 4, 8, 16, 32), random.Random(1), noise=0.0), devices_per_node=8)
    for tier in (INTRA, INTER):  # noise-free: the model inverted exactly, the inter-node α from the crossings alone
        assert exact[tier].alpha_s == pytest.approx(truth[tier].alpha_s, rel=1e-9)
        assert exact[tier].beta_bytes_per_s == pytest.approx(truth[tier].beta_bytes_per_s, rel=1e-9)
    assert set(fit_tiers(samples[:15], devices_per_node=8)) == {INTRA}  # n=2 only: one node
    with pytest.raises(ValueError, match="of its steps within a node: fit the intra-node tier first"):
        fit_tiers([s for s in samples if s["world_size"] > 8], devices_per_node=8)
    net = Network(tiers, 8)
    assert net.reaches(1) and net.reaches(1024)
    assert not Network({INTRA: tiers[INTRA]}, 8).reaches(16)
    assert Network({INTRA: tiers[INTRA]}, None).reaches(1024)  # no node boundary: one tier (CPU)


def test_the_replicas_strided_rings_are_fitted_on_the_tier_they_cross():
    """Hybrid sharding's replicas lie a shard group apart: on 8-GPU nodes a ring of 4 ranks 8 apart has one rank per
    node and crosses nodes at every step (the inter-node tier, whose α it pays 2·3 times in an all-reduce), one 4
    apart has two per node; timings of strided rings are fitted with their tier's figures."""
    truth = {INTRA: AlphaBeta(3e-6, 300e9), INTER: AlphaBeta(15e-6, 40e9)}
    assert sample_ring({"world_size": 4, "stride": 8}, 8) == (4, 1) and sample_ring({"world_size": 4}, 8) == (4, 8)
    assert sample_ring({"world_size": 4, "stride": 4}, 8) == (4, 2) and sample_ring(
        {"world_size": 4, "stride": 2}, None
    ) == (4, None)
    contiguous = _samples(truth, 8, (2, 4, 8), random.Random(3), noise=0.0)
    strided = [{**s, "stride": 8} for s in _samples(truth, 1, (2, 4), random.Random(4), noise=0.0)]
    tiers = fit_tiers([*contiguous, *strided], devices_per_node=8)
    for tier in (INTRA, INTER):
        assert tiers[tier].alpha_s == pytest.approx(truth[tier].alpha_s, rel=1e-6)
        assert tiers[tier].beta_bytes_per_s == pytest.approx(truth[tier].beta_bytes_per_s, rel=1e-6)


def test_profile_round_trip_and_bootstrap_draws(tmp_path):
    truth = {INTRA: AlphaBeta(5e-6, 100e9)}
    samples = _samples(truth, None, (2, 4), random.Random(2), noise=0.1)
    profile = Profile("gloo on host", None, fit_tiers(samples, None), tuple(samples), "2026-01-01T00:00:00+00:00")
    back = load_profile(save_profile(tmp_path / PROFILE_FILE, profile))
    assert back == profile
    assert json.loads((tmp_path / PROFILE_FILE).read_text())["tiers"][INTRA]["world_sizes"] == [2, 4]
    est = profile_estimate(back, None, 50, np.random.default_rng(0))
    betas = [d.tiers[INTRA].beta_bytes_per_s for d in est.draws]
    assert est.kind == "profile" and len(betas) == 50
    assert min(betas) < profile.tiers[INTRA].beta_bytes_per_s < max(betas)  # the timed calls' noise shows
    assert max(betas) / min(betas) < 1.5
    est = profile_estimate(back, 8, 5, np.random.default_rng(0))
    assert est.notes == ("measured with devices_per_node=None, the sweep has 8",)


def test_an_old_profile_is_refused_with_the_command_that_replaces_it(tmp_path):
    (tmp_path / PROFILE_FILE).write_text(json.dumps({"alpha_s": 1e-5, "beta_bytes_per_s": 1e9}))
    with pytest.raises(ValueError, match="not a network profile .* `scaling collectives --sweep-dir"):
        load_profile(tmp_path / PROFILE_FILE)


def test_published_figures_are_ranges_and_draws_stay_inside(tmp_path):
    tiers = published("h100")
    assert set(tiers) == {INTRA, INTER}
    assert tiers[INTRA].beta_bytes_per_s == (3.0e11, 4.5e11) and tiers[INTER].beta_bytes_per_s == (2.8e11, 3.84e11)
    assert published("cpu") is None and published("no_such_profile") is None
    assert all(published(h) for h in ("a100", "h200"))
    est = published_estimate("h100", 8, 200, np.random.default_rng(0))
    assert est.kind == "published" and est.nominal.tiers[INTER].beta_bytes_per_s == pytest.approx(
        (2.8e11 * 3.84e11) ** 0.5
    )
    for d in est.draws:
        assert 5e-6 <= d.tiers[INTER].alpha_s <= 2e-5 and 3.0e11 <= d.tiers[INTRA].beta_bytes_per_s <= 4.5e11
    (tmp_path / "bad.yaml").write_text("name: bad\nintra_node:\n  alpha_s: [2.0e-6]\n  beta_bytes_per_s: [1, 2]\n")
    with pytest.raises(ValueError, match=r"intra_node.alpha_s=\[2e-06\] must be a range \[low, high\]"):
        published("bad", tmp_path)
    (tmp_path / "typo.yaml").write_text("name: typo\nintra: null\n")
    with pytest.raises(ValueError, match=r"unknown keys \['intra'\]"):
        published("typo", tmp_path)


def test_a_profile_measured_on_one_node_borrows_the_inter_node_tier():
    rng = np.random.default_rng(0)
    samples = _samples({INTRA: AlphaBeta(5e-6, 100e9)}, 8, (2, 4, 8), random.Random(3))
    prof = profile_estimate(Profile("one node", 8, fit_tiers(samples, 8), tuple(samples)), 8, 20, rng)
    both = with_fallback(prof, published_estimate("h100", 8, 20, rng))
    assert both.kind == "profile" and both.label.endswith(
        "inter_node from published h100 figures (conf/network/h100.yaml)"
    )
    assert both.nominal.tiers[INTRA] == prof.nominal.tiers[INTRA]
    assert both.nominal.tiers[INTER].beta_bytes_per_s == pytest.approx((2.8e11 * 3.84e11) ** 0.5)
    assert all(d.reaches(1024) for d in both.draws)


@pytest.mark.parametrize(
    "dp, dpn, sizes",
    [
        (1, None, [2]),
        (2, None, [2]),
        (6, 8, [2, 4, 6]),
        (8, 8, [2, 4, 8]),
        (32, 8, [2, 4, 8, 16, 32]),
        (4, 1, [2, 4]),
        (24, 8, [2, 4, 8, 16, 24]),
    ],
)
def test_world_sizes_of_the_benchmark(dp, dpn, sizes):
    assert world_sizes(dp, dpn) == sizes


@pytest.mark.parametrize(
    "layout, plan",
    [
        (("parallel.dp=4",), {2: None, 4: None}),
        (("parallel.dp=2", "parallel.tp=2"), {2: None, 4: "2"}),
        (("parallel.dp=4", "parallel.dp_shard=2"), {2: None, 4: "2"}),
        (("parallel.dp=2", "parallel.dp_shard=2", "parallel.tp=4"), {2: None, 4: None, 8: "4"}),
        (("parallel.dp=4", "parallel.dp_shard=2", "parallel.tp=2"), {2: None, 4: None, 8: "2,4"}),
    ],
)
def test_the_largest_launch_also_times_the_rings_of_the_layout(tmp_path, layout, plan):
    """A point of dp × tp ranks runs rings of every rank (tp's own, within its group), of the dp ranks of one
    tensor-parallel rank (tp apart) and of hybrid sharding's replicas (dp_shard × tp apart): the benchmark plans up
    to dp × tp ranks, its largest launch timing each strided ring besides every rank's."""
    from scaling.launch.network_probe import plan_launches
    from scaling.sweep.compose import compose_config

    cfg = compose_config(["hardware=h100", *layout])
    launches = plan_launches(cfg, tmp_path, [4096], 2, {})
    strides = {n: argv[argv.index("--stride") + 1] if "--stride" in argv else None for n, (_, argv) in launches.items()}
    assert strides == plan


@pytest.mark.torchrun
def test_scaling_collectives_measures_through_torchrun_into_the_sweep_dir(tmp_path, capsys):
    """The real command at dp=2 × tp=2: launches of 2 and 4 ranks over gloo (torchrun, as a point's), the 4's also
    timing the two rings of ranks 2 apart at once; JSON back in each job directory, the profile fitted and written;
    the sweep's earlier profile (planted: one measured long ago) is kept beside it, not overwritten."""
    sweep = tmp_path / "sweep"
    samples = _samples({INTRA: AlphaBeta(5e-6, 100e9)}, None, (2, 4), random.Random(2), noise=0.1)
    earlier = Profile("gloo on host", None, fit_tiers(samples, None), tuple(samples), "2026-01-01T00:00:00+00:00")
    sweep.mkdir()
    save_profile(sweep / PROFILE_FILE, earlier)
    args = ["--sweep-dir", str(sweep), "--iters", "2", "--sizes", "4Ki,4Mi", "parallel.dp=2", "parallel.tp=2"]
    assert main([*args, "hardware.oversubscribe=true", "launch.timeout_s=120"]) == 0
    out = capsys.readouterr().out
    assert f"profile: {sweep / PROFILE_FILE}" in out and "intra_node: α = " in out
    profile = load_profile(sweep / PROFILE_FILE)
    assert profile.name.startswith("gloo on ") and profile.name.endswith(", n=2,4") and set(profile.tiers) == {INTRA}
    rings = {(r["world_size"], r.get("stride", 1)) for r in profile.samples}
    assert rings == {(2, 1), (2, 2), (4, 1)}, rings
    for ring in rings:
        timed = {
            (r["op"], r["size_bytes"]): r for r in profile.samples if (r["world_size"], r.get("stride", 1)) == ring
        }
        assert set(timed) == {(op, s) for op in OPS for s in (4096, 4 * 2**20)}, ring
        for (op, size), r in timed.items():
            assert r["time_s"] > 0 and len(r["times_s"]) == 2
            assert r["busbw_bytes_per_s"] == pytest.approx(size / r["time_s"] * bus_factor(op, ring[0]))
    for n in (2, 4):
        job = sweep / BENCH_DIR / f"n{n}"
        assert (job / BENCH_OUTPUT).exists() and (job / TORCHRUN_LOG).exists()
        config = json.loads((job / CONFIG_FILE).read_text())
        assert config["world_size"] == n and "--standalone" in config["argv"]  # scaling.launch.torchrun's, as a point's
        assert config["argv"][-2:] == ["--out", str(job / BENCH_OUTPUT)]
        assert "scaling.engine.collective_bench" in config["argv"] and ("--stride" in config["argv"]) == (n == 4)
    kept = [p for p in sweep.glob("alpha_beta.*.json")]
    assert [p.name for p in kept] == ["alpha_beta.2026-01-01T00-00-00+00-00.json"] and load_profile(kept[0]) == earlier
    assert f"the earlier one kept as {kept[0].name}" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--iters", "1"], "--iters=1: at least 2 timed calls"),
        (["--sizes", "4Ki,abc"], "--sizes='4Ki,abc': 'abc' is not a count"),
        (["parallel.dpp=3"], "Could not override 'parallel.dpp'"),
    ],
)
def test_scaling_collectives_rejects_bad_arguments_before_any_launch(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(["--sweep-dir", str(tmp_path), *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_scaling_collectives_beyond_one_node_needs_slurm(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["--sweep-dir", str(tmp_path), "hardware=h100", "parallel.dp=16"]) == 2
    assert (
        "parallel.dp=16 with hardware.devices_per_node=8 spans 2 nodes: run scaling collectives inside a SLURM "
        "allocation of them (salloc --nodes=2"
    ) in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_collectives_worker_rejects_bad_sizes(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--sizes", "12,abc", "--out", "x.json"])
    assert exc.value.code == 2 and "--sizes='12,abc': give byte counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--sizes", "1024", "--ops", "broadcast", "--out", "x.json"])
    assert "--ops='broadcast': choose from all_reduce, reduce_scatter, all_gather" in capsys.readouterr().err


@pytest.mark.slurm
def test_scaling_collectives_spans_two_nodes_under_slurm(slurm_cluster, tmp_path):
    """In a two-node allocation: n=2 within a node (torchrun here), n=4 across both (srun + torchrun, c10d)."""
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("the test cluster has one node")
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        [
            "salloc",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--time=5",
            sys.executable,
            "-m",
            "scaling.cli.main",
            "collectives",
            "--sweep-dir",
            str(sweep),
            "--iters",
            "3",
            "--sizes",
            "4Ki,16Mi",
            "hardware.devices_per_node=2",
            "parallel.dp=4",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    profile = load_profile(sweep / PROFILE_FILE)
    assert profile.devices_per_node == 2 and set(profile.tiers) == {INTRA, INTER}
    assert sorted({s["world_size"] for s in profile.samples}) == [2, 4]
    nodes = {n: json.loads((sweep / BENCH_DIR / f"n{n}" / BENCH_OUTPUT).read_text())["nodes"] for n in (2, 4)}
    assert len(set(nodes[2])) == 1 and sorted(set(nodes[4])) == slurm_cluster.nodes[:2]
    assert f"profile: {sweep / PROFILE_FILE}" in done.stdout


def test_an_op_whose_transport_moves_more_than_a_ring_gets_its_own_bytes_factor():
    # gloo's reduce-scatter on two ranks, as measured: some 4x the ring's one pass (benchmarks/RESULTS.md)
    from scaling.perf.network import Network, fit_op_scale, ring_cost

    net = Network({"intra_node": AlphaBeta(100e-6, 1e9)}, None)
    samples = []
    for op, k in (("all_reduce", 1.0), ("all_gather", 1.0), ("reduce_scatter", 4.0)):
        for size in (2**20, 4 * 2**20, 16 * 2**20, 4096):
            steps, moved = ring_cost(op, 2, size)
            samples.append({"op": op, "world_size": 2, "size_bytes": size, "time_s": steps * 100e-6 + k * moved / 1e9})
    scale = dict(fit_op_scale(samples, net))
    assert scale == pytest.approx({"all_reduce": 1.0, "all_gather": 1.0, "reduce_scatter": 4.0})
    scaled = Network(net.tiers, None, tuple(scale.items()))
    assert scaled.time_s("reduce_scatter", 2, 2**24) == pytest.approx(100e-6 + 4 * 2**23 / 1e9)
    assert scaled.on_ring(4).op_scale == scaled.op_scale  # a strided ring keeps the factors


def test_rings_that_cross_a_node_at_once_share_its_links_only_where_it_has_fewer_than_they():
    from scaling.core.schema import ModelConfig
    from scaling.perf.step_model import REPLICAS, Workload, comm_windows
    from tests.helpers.synthetic_dp import shape

    assert [Network({}, 8).flows(k) for k in (1, 4, 8)] == [1, 1, 1]  # a link per device (rails)
    assert [Network({}, 8, links_per_node=1).flows(k) for k in (1, 2, 8)] == [1, 2, 8]
    assert [Network({}, 8, links_per_node=2).flows(k) for k in (2, 3, 8)] == [1, 2, 4]
    model = ModelConfig(name="m", n_layers=2, hidden=256, n_heads=4, n_kv_heads=4, ffn_hidden=512, vocab_size=1024)
    tiers = {INTRA: AlphaBeta(0.0, float("inf")), INTER: AlphaBeta(0.0, 1e8)}  # the link alone costs: intra free

    def step_comm(dp_shard, links):
        w = Workload(3, shape(model), "fp32", 1, 64, None, dp_shard=dp_shard)
        return sum(t * s for t, s, _ in comm_windows(w, Network(tiers, 2, links_per_node=links), 4, 1))

    hybrid = Workload(3, shape(model), "fp32", 1, 64, None, dp_shard=2)
    assert hybrid.rings_at_once(REPLICAS, 4, 2) == 2  # two replica rings (one per shard index) cross at once
    assert step_comm(2, 1) == pytest.approx(2 * step_comm(2, None))  # they halve one link's bandwidth
    assert step_comm(2, 2) == pytest.approx(step_comm(2, None))  # two links: one each
    assert step_comm(None, 1) == pytest.approx(step_comm(None, None))  # full sharding: one ring crosses
    assert Workload(3, shape(model), "fp32", 1, 64, None, tp=2).rings_at_once("all", 4, 4) == 2  # one per tp rank


def test_a_strided_ring_timed_beside_the_others_is_fitted_as_one_rings_bandwidth_on_a_shared_link():
    # 2 nodes of 2: the flat ring of 4 crosses once per direction; the two replica rings (stride 2) cross at once
    link = 1e8
    samples = []
    for size in (2**20, 4 * 2**20, 16 * 2**20):
        for op in ("all_reduce", "all_gather"):
            for n, stride, flows in ((2, 1, 1), (4, 1, 1), (2, 2, 2)):
                _, moved = ring_cost(op, n, size)
                per_node = 2 if stride == 1 else 1
                intra = n <= per_node
                t = moved / (1e10 if intra else link / flows) + 1e-5 * ring_cost(op, n, 0)[0]
                samples.append({"op": op, "world_size": n, "size_bytes": size, "time_s": t,
                                **({"stride": stride} if stride > 1 else {})})  # fmt: skip
    shared = fit_tiers(samples, 2, links_per_node=1)
    assert shared[INTER].beta_bytes_per_s == pytest.approx(link, rel=0.02)
    own = fit_tiers(samples, 2)  # as if each replica ring had a link of its own: a β between the two
    assert own[INTER].beta_bytes_per_s < 0.9 * link
