"""α-β model: ring costs, the fit recovering known α and β, extrapolation, and a real torchrun benchmark."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from analysis.alpha_beta import (
    DEFAULT_SIZES, PROFILE_FILE, AlphaBeta, dp_comm_s, extrapolate, fit, load_profile, measure, ring_cost,
    run_collectives, save_profile,
)
from scaling.engine.collectives import OPS, bus_factor, parse_args


def test_ring_costs():
    assert ring_cost("all_reduce", 4, 1000) == (6, 1500.0)
    assert ring_cost("reduce_scatter", 4, 1000) == (3, 750.0)
    assert ring_cost("all_gather", 8, 800) == (7, 700.0)
    assert ring_cost("all_reduce", 1, 1000) == (0, 0.0)
    with pytest.raises(ValueError, match="op='broadcast' is not a collective of the model"):
        ring_cost("broadcast", 2, 1)
    assert bus_factor("all_reduce", 4) == 1.5 and bus_factor("all_gather", 4) == 0.75


@pytest.mark.parametrize("alpha_s, beta", [(30e-6, 25e9), (2e-3, 0.5e9)])
def test_fit_recovers_alpha_and_beta_within_5_percent(alpha_s, beta):
    truth = AlphaBeta(alpha_s, beta)
    rng = random.Random(0)
    samples = [{"op": op, "world_size": n, "size_bytes": s, "time_s": truth.time_s(op, n, s) * (1 + rng.gauss(0, 0.03))}
               for op in OPS for n in (2, 4, 8) for s in (1024, *DEFAULT_SIZES, 256 * 1024**2)]
    got = fit(samples)
    assert got.alpha_s == pytest.approx(alpha_s, rel=0.05)
    assert got.beta_bytes_per_s == pytest.approx(beta, rel=0.05)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="at least two sizes"):
        fit([{"op": "all_reduce", "world_size": 2, "size_bytes": 1024, "time_s": 1e-3}])


def test_zero_stage_decides_the_collectives():
    ab = AlphaBeta(10e-6, 10e9)
    grad = 2e9
    assert dp_comm_s(ab, 0, 8, grad) == dp_comm_s(ab, 1, 8, grad) == ab.time_s("all_reduce", 8, grad)
    assert dp_comm_s(ab, 3, 8, grad) == pytest.approx(ab.time_s("reduce_scatter", 8, grad)
                                                      + ab.time_s("all_gather", 8, grad))
    with pytest.raises(ValueError, match="zero_stage=5"):
        dp_comm_s(ab, 5, 8, grad)


def test_extrapolation_to_1024_marks_measured_and_extrapolated():
    measured = pd.DataFrame({"dp": [1, 2, 4], "tokens_per_s_per_gpu": [1000.0, 950.0, 900.0],
                             "step_time_s": [4.096, 4.3, 4.5], "gbs_tokens": [4096, 8192, 16384],
                             "n_params": [100_000_000] * 3, "precision": ["bf16"] * 3, "zero_stage": [1] * 3})
    ab = AlphaBeta(50e-6, 10e9)
    out = extrapolate(measured, ab)
    assert list(out["dp"]) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert list(out["source"][:3]) == ["measured"] * 3 and set(out["source"][3:]) == {"extrapolated"}
    assert list(out["tokens_per_s_per_gpu"][:3]) == [1000.0, 950.0, 900.0]
    # at dp=1024: 4096 tokens per rank over 4.096 s of compute plus one all-reduce of 2e8 bytes of bf16 grads
    comm = ab.time_s("all_reduce", 1024, 2e8)
    assert out["tokens_per_s_per_gpu"].iloc[-1] == pytest.approx(4096 / (4.096 + comm))
    assert out["model_tokens_per_s_per_gpu"].is_monotonic_decreasing


def test_profile_round_trip(tmp_path):
    ab = AlphaBeta(1e-5, 3e9, "gloo on host")
    assert load_profile(save_profile(tmp_path / "alpha_beta.json", ab, [])) == ab


def test_measure_runs_the_worker_under_torchrun_and_fits(tmp_path):
    """One real torchrun of scaling.engine.collectives: 2 ranks over gloo, tiny sizes, JSON back, α-β fitted."""
    sizes = (4096, 4 * 1024**2)  # far apart, so the bandwidth term shows through a busy machine's noise
    ab, samples = measure((2,), sizes_bytes=sizes, iters=5, backend="gloo")
    assert ab.name.startswith("gloo on ") and ab.name.endswith("(n=2)")
    results = {(r["op"], r["size_bytes"]): r for r in samples}
    assert set(results) == {(op, s) for op in OPS for s in sizes}
    for (op, size), r in results.items():
        assert r["world_size"] == 2 and r["time_s"] > 0 and len(r["times_s"]) == 5
        assert r["algbw_bytes_per_s"] == pytest.approx(size / r["time_s"])
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * bus_factor(op, 2))
    assert ab.beta_bytes_per_s > 0 and ab.alpha_s >= 0
    profile = load_profile(save_profile(tmp_path / PROFILE_FILE, ab, samples))
    assert profile == ab


def test_run_collectives_needs_two_ranks():
    with pytest.raises(ValueError, match="world_size=1: a collective benchmark needs at least 2 ranks"):
        run_collectives(1)


def test_collectives_worker_rejects_bad_sizes(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--sizes", "12,abc", "--out", "x.json"])
    assert exc.value.code == 2 and "--sizes='12,abc': give byte counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--sizes", "1024", "--ops", "broadcast", "--out", "x.json"])
    assert "--ops='broadcast': choose from all_reduce, reduce_scatter, all_gather" in capsys.readouterr().err
