"""Records -> DataFrame: columns, statuses, Parquet, the W&B run mapping, and the records left out."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.collect import (
    COLUMNS,
    CONFIG_AXES,
    collect,
    latest_attempts,
    record_to_row,
    to_frame,
    to_parquet,
)
from analysis.usable import LeftOut, record_problem
from scaling.core.enums import Status
from tests.helpers.records import grid_records, key_of, make_record, write_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return write_sweep(tmp_path_factory.mktemp("sweep"), grid_records())


def test_one_row_per_record_with_short_config_columns(sweep):
    df = collect(sweep)
    assert len(df) == len(list(sweep.glob("*/result.json")))
    for column in (
        "model",
        "seq_len",
        "mbs",
        "grad_acc",
        "dp",
        "zero_stage",
        "precision",
        "recompute",
        "hardware",
        "memory_gb",
        "tokens_per_s_per_gpu",
        "mfu",
        "peak_mem_bytes",
        "pred_peak_mem_bytes",
        "pred_fits",
        "step_time_s",
        "n_params",
        "wall_s",
    ):
        assert column in df.columns, column
    assert list(df.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert set(df["dp"].dropna()) == {1, 2, 4, 8, 16}
    assert df["seq_len"].dtype == "Int64"
    # what the step model reads of a configuration (analysis.dp_extrapolation.workload_and_points): clipping and tying
    assert set(df["grad_clip"]) == {1.0} and set(df["tie_embeddings"]) == {False}


def test_the_step_model_reads_clipping_and_tying_from_the_records(tmp_path):
    """A ZeRO-3 sweep's records, through collect, give the step model the clipping all-reduce and the tied
    output projection they were measured with."""
    from analysis.dp_extrapolation import workload_and_points
    from scaling.model.llama.args import ModelArgs, param_count

    records = [make_record(dp=n, zero_stage=3) for n in (1, 2)]
    for r in records:
        r["config"]["model"]["tie_embeddings"] = True
        r["job_key"] = key_of(r["config"])  # another point: a record is its folder's (scaling.store.read)
        r["derived"]["n_params"] = param_count(ModelArgs.from_dict(r["config"]["model"]))
    df = collect(write_sweep(tmp_path, records))
    w, _ = workload_and_points(df)
    assert w.grad_clip == 1.0 and w.collectives()[-1].moves == "gradient norm"
    assert "output" not in [t.name for t in w.model.tensors]  # tied: the embedding is the projection
    # and the backend: NCCL enqueues FSDP2's calls (they may hide behind compute), gloo holds the host through them
    assert not w.host_blocking
    for r in records:
        r["env"]["backend"] = "gloo"
    w, _ = workload_and_points(collect(write_sweep(tmp_path / "gloo", records)))
    assert w.host_blocking


def test_every_status_kept_distinct_and_metrics_null_when_not_ok(sweep):
    df = collect(sweep)
    assert list(df["status"].cat.categories) == list(Status)
    counts = df["status"].value_counts()
    assert all(counts[s] >= 1 for s in Status), counts
    not_ok = df[df["status"] != "ok"]
    assert not_ok["tokens_per_s_per_gpu"].isna().all()
    assert df.loc[df["status"] == "ok", "tokens_per_s_per_gpu"].notna().all()
    assert df.loc[df["status"] == "failed", "error"].str.contains("crashed").all()


def test_missing_metrics_and_predictions_are_nulls(tmp_path):
    record = make_record("timeout")
    del record["metrics"]
    record["predicted"] = None
    row = record_to_row(record)
    assert row["tokens_per_s"] is None and row["pred_peak_mem_bytes"] is None and row["status"] == "timeout"


def test_unknown_status_is_a_clear_error():
    record = make_record("ok")
    record["status"] = "exploded"
    with pytest.raises(ValueError, match=r"status='exploded' is not one of ok, oom"):
        record_to_row(record)


@pytest.mark.parametrize("status", list(Status))
def test_every_record_the_engine_writes_is_usable(status):
    assert record_problem(make_record(status, dp=4, grad_acc=2)) is None


def test_an_invalid_point_is_usable_however_impossible_its_config():
    record = make_record(Status.INVALID)
    record["config"]["parallel"]["zero_stage"] = 5
    assert record_problem(record) is None


def edited(path, value, **kw):
    """A synthetic record with one value set by hand (`path` like derived.world_size)."""
    record = make_record(**kw)
    *parents, leaf = path.split(".")
    node = record
    for part in parents:
        node = node[part]
    node[leaf] = value
    return record


@pytest.mark.parametrize(
    "record, why",
    [
        (edited("derived.world_size", 4, dp=2), "derived.world_size=4 disagrees with config.parallel.dp=2"),
        (
            edited("derived.grad_acc", 2, grad_acc=4, dp=2),
            "derived.grad_acc=2 disagrees with config.train.grad_acc=4; derived.gbs=8 is not mbs × grad_acc × dp = "
            "1 × 2 × 2 = 4",
        ),
        (edited("derived.gbs_tokens", 100, dp=2), "derived.gbs_tokens=100 is not gbs × seq_len = 2 × 256 = 512"),
        (edited("config.train.gbs", 16, dp=2), "config.train.gbs=16 but the record derived 2"),
        (edited("config.train.mbs", "2", dp=2), "config.train.mbs='2' is not a positive integer"),
        (edited("config.parallel.zero_stage", 4), "config.parallel.zero_stage=4 is not one of 0, 1, 2, 3"),
        (edited("derived", None), "derived=null: a point that passed validation records its batch arithmetic"),
        (edited("derived.n_params", None), "status ok but derived.n_params=None is not a positive integer"),
        (edited("metrics.step_time_s", 0.0), "status ok but metrics.step_time_s=0.0 is not a positive number"),
        (
            edited("config", {"model": {}, "train": {}}),
            "config lacks parallel, hardware (an experiment config has model, train, parallel, hardware)",
        ),
        (["not", "a", "record"], "not a record: a JSON list, not an object"),
    ],
)
def test_record_problem_names_the_field_its_value_and_what_would_agree(record, why):
    assert record_problem(record) == why


@pytest.mark.parametrize("axis", ["tp", "pp"])
def test_a_model_parallel_point_is_usable_and_its_world_is_dp_times_its_degrees(axis):
    """A tp or pp point runs dp × degree ranks: the analysis used it (it was left out for disagreeing with dp)."""
    record = edited(f"config.parallel.{axis}", 2, dp=2)
    record["derived"]["world_size"] = 4
    assert record_problem(record) is None
    record["derived"]["world_size"] = 2
    assert record_problem(record) == f"derived.world_size=2 disagrees with config.parallel.dp=2 x parallel.{axis}=2 = 4"


def test_collect_leaves_out_what_it_cannot_use_and_names_each_once(tmp_path, capsys):
    good, bad = make_record(dp=1), edited("derived.gbs", 1, dp=8)
    bad["derived"]["gbs_tokens"] = 256
    sweep = write_sweep(tmp_path / "s", [good, bad])
    assert list(collect(sweep)["job_key"]) == [good["job_key"]]
    assert capsys.readouterr().err == (
        f"[analysis] left out {bad['job_key']}: derived.gbs=1 is not mbs × grad_acc × dp = 1 × 1 × 8 = 8\n"
    )
    left_out: list[LeftOut] = []
    assert len(collect(sweep, left_out=left_out)) == 1 and capsys.readouterr().err == ""  # the caller names them
    assert left_out == [LeftOut(bad["job_key"], "derived.gbs=1 is not mbs × grad_acc × dp = 1 × 1 × 8 = 8")]


def test_missing_sweep_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="sweep_dir=.*nope.*is not a directory"):
        collect(tmp_path / "nope")


def test_parquet_round_trip(sweep, tmp_path):
    df = collect(sweep)
    back = pd.read_parquet(to_parquet(df, tmp_path / "out" / "results.parquet"))
    assert len(back) == len(df)
    assert back["tokens_per_s_per_gpu"].sum() == pytest.approx(df["tokens_per_s_per_gpu"].sum())
    assert sorted(back["status"].astype(str).unique()) == sorted(Status)
    ok = back[back["status"] == "ok"].iloc[0]
    assert list(ok["losses"]) == [6.2, 6.1, 6.0]


def test_wandb_run_maps_to_the_same_row_as_the_record():
    record = make_record("ok", seq_len=512, mbs=4, grad_acc=2, dp=4, zero_stage=2)
    # run.config is the resolved config (nested), run.summary flat keys with slashes, as W&B stores them
    config = {**json.loads(json.dumps(record["config"])), "_wandb": {"cli_version": "0.31.0"}}
    summary = {
        "status": "ok",
        "error": None,
        "job_key": record["job_key"],
        "_step": 0,
        "_runtime": 3.2,
        **{f"metrics/{k}": v for k, v in record["metrics"].items()},
        **{f"derived/{k}": v for k, v in record["derived"].items()},
        **{f"predicted/{k}": v for k, v in record["predicted"].items()},
    }
    (row,) = latest_attempts([{"id": "abc123", "config": config, "summary": summary, "group": "synthetic"}]).to_dict(
        "records"
    )
    expected = record_to_row(record)
    for column in (
        "model",
        "seq_len",
        "mbs",
        "grad_acc",
        "dp",
        "zero_stage",
        "status",
        "job_key",
        "tokens_per_s_per_gpu",
        "mfu",
        "peak_mem_bytes",
        "pred_peak_mem_bytes",
        "n_params",
        "sweep",
    ):
        assert row[column] == expected[column], column
    assert row["wandb_run_id"] == "abc123"


def test_wandb_summary_with_top_level_metrics_and_dotted_config():
    record = make_record("oom", dp=2)
    config = {f"{group}.{k}": v for group, section in record["config"].items() for k, v in section.items()}
    summary = {"status": "oom", "error": "torch.OutOfMemoryError: x", "peak_mem_bytes": 123}
    (row,) = latest_attempts([{"id": "r1", "config": config, "summary": summary, "group": "g"}]).to_dict("records")
    assert (row["status"], row["dp"], row["peak_mem_bytes"], row["sweep"], row["wandb_run_id"]) == (
        "oom",
        2,
        123,
        "g",
        "r1",
    )
    assert pd.isna(row["tokens_per_s_per_gpu"])


def test_status_and_model_are_ordered_categories_and_timestamps_datetimes(tmp_path):
    sizes = {"llama_70b": 70_553_706_496, "llama_8b": 8_030_261_248, "tiny": 103_552, "llama_1b": 1_235_814_400}
    records = []
    for name, status in (("llama_70b", "ok"), ("llama_8b", "oom"), ("tiny", "invalid"), ("llama_1b", "ok")):
        record = make_record(status, model=name)
        record["derived"]["n_params"] = sizes[name]
        record["timing"]["started_at"] = "2025-03-04T05:06:07+00:00"
        records.append(record)
    df = collect(write_sweep(tmp_path / "s", records))
    assert df["status"].cat.ordered and list(df["status"].cat.categories) == list(Status)
    assert (df["status"] < "failed").sum() == 3  # ok, oom (and predicted_oom, timeout) come before failed
    # by parameter count, not by name: llama_8b before llama_70b
    assert df["model"].cat.ordered
    assert list(df["model"].cat.categories) == ["tiny", "llama_1b", "llama_8b", "llama_70b"]
    assert list(df.sort_values("model")["model"]) == ["tiny", "llama_1b", "llama_8b", "llama_70b"]
    assert isinstance(df["started_at"].dtype, pd.DatetimeTZDtype)
    assert df["started_at"].iloc[0] == pd.Timestamp("2025-03-04T05:06:07Z")


def test_models_without_a_parameter_count_sort_after_by_name():
    rows = [{**record_to_row(make_record("invalid", model=name)), "n_params": None} for name in ("b", "a")]
    rows.append({**record_to_row(make_record("ok", model="c")), "n_params": 5})
    assert list(to_frame(rows)["model"].cat.categories) == ["c", "a", "b"]


def test_noise_device_and_memory_check_columns():
    record = make_record("ok", dp=2, noise_band_frac=0.04, threads_per_device=2, oversubscribe=True)
    record["metrics"].update(
        repeats_ok=3,
        repeat_spread_frac=0.04,
        tokens_per_s_per_gpu_repeats=[1.0, 2.0, 3.0],
        peak_mem_source="mem_tracker",
        peak_rss_growth_bytes=7,
        peak_flops_source="cache",
        peak_flops_measured_at="2026-11-22T10:00:00Z",
    )
    record["predicted"].update(traced={"method": "traced", "peak_mem_bytes": 5}, sampled=True)
    df = to_frame([record_to_row(record)])
    row = df.iloc[0]
    assert (row["threads_per_device"], row["oversubscribe"], row["oversubscribed"]) == (2, True, True)
    assert (row["noise_band_frac"], row["step_time_spread_frac"], row["repeat_spread_frac"]) == (0.04, 0.04, 0.04)
    assert row["repeats_ok"] == 3 and list(row["tokens_per_s_per_gpu_repeats"]) == [1.0, 2.0, 3.0]
    assert (row["peak_mem_source"], row["peak_rss_growth_bytes"], row["peak_flops_source"]) == (
        "mem_tracker",
        7,
        "cache",
    )
    assert row["pred_analytic_peak_mem_bytes"] == record["predicted"]["peak_mem_bytes"]
    assert (row["pred_traced_peak_mem_bytes"], row["pred_sampled"]) == (5, True)
    assert {"threads_per_device", "oversubscribe"} <= set(CONFIG_AXES)
