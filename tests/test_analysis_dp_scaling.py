"""DP scaling: the knee of a known curve, its sentence, the table and the plot."""

from __future__ import annotations

import pytest

from analysis.collect import collect, record_to_row, to_frame
from analysis.dp_scaling import knee_sentence, knees, plot_dp_scaling, scaling_table
from analysis.sections import top_columns
from scaling.perf.knee import find_knee, knee_range
from tests.helpers.records import DP_EFFICIENCY, grid_records, make_record, write_sweep


@pytest.fixture(scope="module")
def df(tmp_path_factory):
    return collect(write_sweep(tmp_path_factory.mktemp("sweep"), grid_records()))


def test_find_knee_on_known_curves():
    assert find_knee([1, 2, 4, 8, 16, 32], [1.0, 0.97, 0.92, 0.85, 0.62, 0.4]) == (8, 16)
    assert find_knee([1, 2, 4], [1.0, 0.95, 0.9]) == (4, None)
    assert find_knee([2, 4, 8], [1.0, 0.7, 0.9]) == (2, 4)  # the first drop ends it, a later rise does not count
    assert find_knee([1, 2, 4, 8], [1.0, 0.9, 0.75, 0.6], threshold=0.7) == (4, 8)


def test_find_knee_rejects_bad_input():
    with pytest.raises(ValueError, match=r"threshold=1.5: an efficiency threshold lies in \(0, 1\]"):
        find_knee([1, 2], [1.0, 0.9], threshold=1.5)
    with pytest.raises(ValueError, match="strictly increasing"):
        find_knee([2, 1], [1.0, 0.9])


def test_sentences_state_where_dp_stops_paying_off():
    s = knee_sentence("llama_1b, seq 4096, ZeRO-1", [1, 2, 4, 8, 16], [1.0, 0.97, 0.92, 0.85, 0.62], 8, 16, 0.8)
    assert s == (
        "for llama_1b, seq 4096, ZeRO-1: DP stops paying off at dp=16: the first count whose efficiency falls below "
        "80% of dp=1 (the last that pays: dp=8); efficiency falls from 85% (dp=8) to 62% (dp=16)"
    )
    s = knee_sentence("tiny, seq 256, ZeRO-0", [1, 2, 4], [1.0, 0.95, 0.9], 4, None, 0.8)
    assert "DP keeps paying off up to dp=4: efficiency stays at or above 80% of dp=1, the largest measured (90%" in s


def test_scaling_table_relative_to_smallest_dp(df):
    table = scaling_table(df)
    group = table[table["config"] == "tiny, seq 256, mbs=1, ZeRO-0"]
    assert list(group["dp"]) == sorted(DP_EFFICIENCY)[:5]
    assert list(group["efficiency"].round(4)) == [DP_EFFICIENCY[d] for d in group["dp"]]
    # the sweep's failure points are not in the curve: seq 1024, mbs=1, ZeRO-0 timed out at dp=2
    assert 2 not in set(table.loc[table["config"] == "tiny, seq 1024, mbs=1, ZeRO-0", "dp"])


def test_knees_of_the_sweep(df):
    found = {k.config: k for k in knees(df)}
    k = found["tiny, seq 256, mbs=1, ZeRO-0"]
    assert (k.knee_dp, k.next_dp) == (8, 16)
    assert "DP stops paying off at dp=16: the first count" in k.sentence
    assert "(the last that pays: dp=8); efficiency falls from 85% (dp=8) to 62% (dp=16)" in k.sentence
    only_small = df[df["dp"] <= 4]
    k = {k.config: k for k in knees(only_small)}["tiny, seq 256, mbs=1, ZeRO-0"]
    assert k.next_dp is None and "keeps paying off up to dp=4" in k.sentence


def test_best_grad_acc_stands_for_a_dp():
    rows = [
        make_record(dp=1, grad_acc=4, tokens_per_s_per_gpu_value=100.0),
        make_record(dp=2, grad_acc=2, tokens_per_s_per_gpu_value=70.0),
        make_record(dp=2, grad_acc=4, tokens_per_s_per_gpu_value=90.0),
    ]
    table = scaling_table(to_frame(record_to_row(r) for r in rows))
    assert list(table["efficiency"]) == [1.0, 0.9] and list(table["grad_acc"]) == [4, 4]


def test_plot_marks_the_knee(df):
    fig = plot_dp_scaling(df, max_configs=3)
    knee_marks = [line for ax in fig.axes for line in ax.get_lines() if (line.get_gid() or "").startswith("knee:")]
    assert len(knee_marks) == 3
    assert all(list(line.get_xdata()) == [8] for line in knee_marks)
    assert "the 3 fastest of" in fig._suptitle.get_text()


def test_a_fixed_global_batch_is_its_own_configuration():
    rows = []
    for gbs_tokens, tps in ((4096, (100.0, 90.0)), (8192, (100.0, 60.0))):
        for dp, value in zip((1, 2), tps):
            record = make_record(dp=dp, grad_acc=gbs_tokens // (256 * dp), tokens_per_s_per_gpu_value=value)
            record["config"]["train"].update(grad_acc="auto", gbs_tokens=gbs_tokens)
            rows.append(record_to_row(record))
    found = {k.config: k for k in knees(to_frame(rows))}
    assert set(found) == {f"tiny, seq 256, ZeRO-0, target_gbs_tokens={n}" for n in (4096, 8192)}
    assert found["tiny, seq 256, ZeRO-0, target_gbs_tokens=8192"].next_dp == 2


def _curve(band: float, **extra) -> list[dict]:
    return [make_record(dp=dp, grad_acc=max(8 // dp, 1), noise_band_frac=band, **extra) for dp in (1, 2, 4, 8, 16)]


def test_the_knee_is_stated_with_the_dps_it_may_lie_at_within_noise():
    # efficiencies 97%, 92%, 85%, 62% vs dp=1; each point ±5%, so each efficiency ±10%
    (k,) = knees(to_frame(record_to_row(r) for r in _curve(0.05)))
    assert (k.knee_dp, k.next_dp, k.within_noise) == (8, 16, (4,))
    assert k.noise_frac == pytest.approx((0.0, 0.1, 0.1, 0.1, 0.1))
    assert (
        "DP stops paying off at dp=16: the first count whose efficiency falls below 80% of dp=1 (the last that pays: "
        "dp=8, or dp=4 within noise); efficiency falls from 85% ± 8 pts (dp=8) to 62% ± 6 pts (dp=16)"
    ) in k.sentence
    (k,) = knees(to_frame(record_to_row(r) for r in _curve(0.15)))  # ±30%: 62% may be 81%, 97% may be 68%
    assert k.within_noise == (1, 2, 4, 16)
    (k,) = knees(to_frame(record_to_row(r) for r in _curve(0.0)))
    assert k.within_noise == () and "within noise" not in k.sentence
    assert knee_range([1, 2, 4], [1.0, 0.85, 0.75], [0.0, 0.1, 0.1]) == (1, 4)


def test_points_of_different_thread_counts_never_share_a_curve():
    rows = [record_to_row(r) for r in _curve(0.0) + _curve(0.0, threads_per_device=2) + _curve(0.0, oversubscribe=True)]
    found = {k.config for k in knees(to_frame(rows))}
    assert found == {
        "tiny, seq 256, ZeRO-0, 1 thread/device",
        "tiny, seq 256, ZeRO-0, 2 threads/device",
        "tiny, seq 256, ZeRO-0, 1 thread/device, oversubscription allowed",
    }


def test_pipeline_stages_and_their_schedule_are_curves_of_their_own():
    """pp is an axis of the DP curves (and the heatmaps, which take the schema's axes): a pipeline's points never
    share a curve with plain data parallelism's, nor one schedule's with another's."""

    def staged(schedule: str) -> list[dict]:
        records = _curve(0.0)
        for r in records:
            r["config"]["parallel"].update(pp=2, pp_schedule=schedule)
        return records

    rows = [record_to_row(r) for r in _curve(0.0) + staged("one_f_one_b") + staged("gpipe")]
    found = {k.config for k in knees(to_frame(rows))}
    assert found == {
        "tiny, seq 256, ZeRO-0, pp=1, pp_schedule=one_f_one_b",
        "tiny, seq 256, ZeRO-0, pp=2, pp_schedule=gpipe",
        "tiny, seq 256, ZeRO-0, pp=2, pp_schedule=one_f_one_b",
    }


def test_an_axis_is_named_where_it_varies_though_no_two_points_of_one_stage_differ_in_it():
    """ZeRO-0 at tp 1 beside ZeRO-3 at tp 2: within each stage tp is one value, but the table holds two, so both
    curves (and the report's top table) say which (they said "ZeRO-3" alone of a tensor-parallel curve); a model's
    shapes, which its name says, are still not named."""
    tensor_parallel = _curve(0.0, zero_stage=3)
    for r in tensor_parallel:
        r["config"]["parallel"]["tp"] = 2
        r["derived"]["world_size"] *= 2
    frame = to_frame(record_to_row(r) for r in _curve(0.0) + tensor_parallel)
    assert {k.config for k in knees(frame)} == {"tiny, seq 256, ZeRO-0, tp=1", "tiny, seq 256, ZeRO-3, tp=2"}
    columns = top_columns(frame[frame["status"] == "ok"])
    assert "tp" in columns and "hidden" not in columns and "pp" not in columns
