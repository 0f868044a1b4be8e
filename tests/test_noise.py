"""Noise and repeats, the pure parts: the spread statistic, a point's metrics over its launches, and
the resume rule that treats a point with fewer ok launches than `launch.repeats` as not done."""

from __future__ import annotations

import statistics

import pytest

from scaling.core.noise import relative_spread, tied, within_noise
from scaling.core.schema import LaunchConfig
from scaling.job.throughput import repeats_metrics
from scaling.store.record import (
    Launch,
    LaunchTiming,
    Timing,
    answers,
    kept_launches,
    ok_launches,
)
from tests.helpers.launches import DERIVED, launch_metrics

KEY = "0" * 12
"""A job key outside any pre-screen sample but the whole one."""


def asked(rerun: str = "none", repeats: int = 1) -> LaunchConfig:
    """The launch settings `answers` reads."""
    return LaunchConfig(rerun=rerun, repeats=repeats, prescreen_sample=0.0)


def launch(status: str, metrics: dict | None = None, launched_at: str = "t0", wait_s: float = 0.0) -> Launch:
    """One entry of a record's `repeats`."""
    return Launch(
        status=status,
        error=None if status == "ok" else "boom",
        metrics=metrics,
        timing=LaunchTiming(
            launched_at=launched_at,
            device_wait_s=wait_s,
            torchrun_wall_s=5.0,
            launch_overhead_s=4.0 if status == "ok" else None,
        ),
    )


def test_relative_spread_is_the_half_range_over_the_median():
    # five launches of one point measured on a 2-core VM: 3,991 / 4,578 / 4,976 / 4,202 / 4,346 tokens/s per GPU
    assert relative_spread([3991, 4578, 4976, 4202, 4346]) == pytest.approx((4976 - 3991) / 2 / 4346)
    assert relative_spread([2.0]) == 0.0
    with pytest.raises(ValueError, match="at least one value"):
        relative_spread([])


def test_two_figures_tie_when_either_lies_within_the_others_band():
    assert within_noise(98.0, 0.01, 100.0, 0.03) and within_noise(100.0, 0.03, 98.0, 0.01)  # 98 in [97, 103]
    assert within_noise(100.0, 0.01, 97.0, 0.04)  # 100 in 97's [93.1, 100.9], though 97 is not in [99, 101]
    assert within_noise(100.0, 0.0, 100.0, 0.0)
    # bands that overlap without holding the other's figure are not a tie: 95 ± 3% and 100 ± 3% meet at 97.85 >= 97
    assert not within_noise(95.0, 0.03, 100.0, 0.03) and not within_noise(100.0, 0.03, 95.0, 0.03)
    assert not within_noise(90.0, 0.03, 100.0, 0.03)


def test_the_recipe_and_the_reports_share_the_one_tie_rule():
    """A predicted ±24% band: an option 20% slower ties with the winner, one 40% slower does not (overlapping bands
    would have tied it)."""
    assert tied(80.0, 61.0, 99.0, 100.0, 76.0, 124.0)
    assert not tied(60.0, 46.0, 74.0, 100.0, 76.0, 124.0)
    assert within_noise(80.0, 0.24, 100.0, 0.24) and not within_noise(60.0, 0.24, 100.0, 0.24)


def test_one_launch_states_its_within_run_spread():
    m = launch_metrics([0.5, 0.4, 0.6], [10, 12])
    assert m["step_time_s"] == 0.5 and m["tokens_per_s"] == 2000.0 and m["tokens_per_s_per_gpu"] == 1000.0
    assert m["step_time_spread_frac"] == pytest.approx(0.2) and m["noise_band_frac"] == pytest.approx(0.2)
    assert m["repeat_spread_frac"] is None and m["repeats_ok"] == 1 and m["tokens_per_s_per_gpu_repeats"] == [1000.0]
    assert repeats_metrics([m], DERIVED) == m


def test_repeats_headline_is_the_median_launch_with_both_spreads():
    launches = [
        launch_metrics([0.50, 0.51, 0.49], [10, 12]),
        launch_metrics([0.40, 0.41, 0.40], [11, 9]),
        launch_metrics([0.62, 0.60, 0.61], [10, 10]),
    ]
    m = repeats_metrics(launches, DERIVED)
    assert m["step_time_s"] == 0.5  # the median of the launches' medians 0.5, 0.4, 0.61
    assert m["tokens_per_s"] == pytest.approx(2000.0) and m["tokens_per_s_per_gpu"] == pytest.approx(1000.0)
    assert m["mfu"] == pytest.approx(6e6 * 1000.0 / 1e12) and m["hfu"] == pytest.approx(8e6 * 1000.0 / 1e12)
    by_launch = [one["tokens_per_s_per_gpu"] for one in launches]
    assert m["tokens_per_s_per_gpu_repeats"] == by_launch and m["repeats_ok"] == 3
    assert m["repeat_spread_frac"] == pytest.approx(
        (max(by_launch) - min(by_launch)) / 2 / statistics.median(by_launch)
    )
    assert m["step_time_spread_frac"] == pytest.approx(
        statistics.median(relative_spread(one["step_times_s"]) for one in launches)
    )
    assert m["noise_band_frac"] == m["repeat_spread_frac"]  # launches differ more than steps within one
    assert m["step_times_s"] == [t for one in launches for t in one["step_times_s"]]  # every timed step kept
    assert m["peak_mem_bytes_per_rank"] == [11, 12] and m["peak_mem_bytes"] == 12
    assert m["peak_rss_growth_bytes_per_rank"] == [22, 24] and m["peak_rss_growth_bytes"] == 24
    assert m["losses"] == [6.0, 5.9]


def test_a_point_with_fewer_ok_launches_than_repeats_is_not_done():
    ok1 = launch("ok", launch_metrics([0.5], [1])).to_dict()
    record = {"status": "ok", "metrics": ok1["metrics"], "repeats": [ok1]}
    assert answers(record, KEY, asked()) and answers(record, KEY, asked("failed"))
    assert not answers(record, KEY, asked(repeats=3))
    assert kept_launches(record, "none") == [ok1] and kept_launches(record, "all") == []
    assert not answers(record, KEY, asked("all"))
    # a failed repeat after two ok ones: the point is failed; rerun=failed keeps the ok launches
    failed = {"status": "failed", "metrics": None, "repeats": [ok1, ok1, launch("failed").to_dict()]}
    assert answers(failed, KEY, asked(repeats=3)) and not answers(failed, KEY, asked("failed", repeats=3))
    assert kept_launches(failed, "failed") == [ok1, ok1]
    for status in ("oom", "predicted_oom", "invalid"):
        assert answers({"status": status, "repeats": []}, KEY, asked(repeats=5))
    assert not answers(None, KEY, asked())


def test_a_record_without_repeats_counts_its_one_ok_launch():
    metrics = launch_metrics([0.5, 0.5], [1])
    record = {"status": "ok", "metrics": metrics, "timing": {"launched_at": "t"}}
    assert [one["metrics"] for one in ok_launches(record)] == [metrics]
    assert answers(record, KEY, asked()) and not answers(record, KEY, asked(repeats=2))
    assert ok_launches({"status": "timeout", "metrics": None}) == []


def test_launch_timing_sums_this_runs_launches():
    started = Timing(started_at="s", wall_s=20.0)
    timing = started.with_launches(
        [
            launch("ok", launched_at="first", wait_s=1.0),
            launch("ok", launched_at="second", wait_s=2.0),
            launch("oom", launched_at="third"),
        ]
    )
    assert timing == Timing(
        started_at="s", wall_s=20.0, launched_at="first", device_wait_s=3.0, torchrun_wall_s=15.0, launch_overhead_s=8.0
    )
    assert started.with_launches([]) == started  # no launch this run: nothing to sum
