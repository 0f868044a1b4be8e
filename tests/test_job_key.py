"""The job key outlives upgrades: the keys of today's configs are pinned, a field added with its neutral value
leaves every key as it was (a store written before it resumes without launching), and a field at any other
value makes a new key."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import pytest

from scaling.core.enums import Status
from scaling.core.schema import (
    EXPERIMENT_GROUPS,
    NEUTRAL,
    DataConfig,
    ExperimentConfig,
    ParallelConfig,
    TrainConfig,
    group_types,
)
from scaling.engine.jobfiles import RESULT_FILE
from scaling.job.run import run_point
from scaling.store.read import read_record
from scaling.store.record import Launch, Record, answers, job_dir, job_key
from tests.helpers.compose import compose_point

GOLDEN = {
    "054b0b1e21f8": (),
    "fae2dc172e68": ("model=small", "parallel.zero_stage=3", "parallel.dp=2"),
    "ce4209a3ec12": ("train.precision=bf16", "train.recompute=full"),
    "13342ab463d9": (
        "hardware=h100",
        "model=llama_1b",
        "train.seq_len=2048",
        "train.mbs=2",
        "train.grad_acc=auto",
        "train.gbs_tokens=1048576",
        "parallel.dp=8",
        "parallel.zero_stage=1",
    ),
}
"""Keys of stores written before fields could declare a neutral value (computed then), by the overrides of
their point. They never change: a key that does strands every record of every store that holds it."""


def _neutral_fields(group: type, prefix: str) -> Iterator[tuple[str, Any]]:
    for f in dataclasses.fields(group):
        if NEUTRAL in f.metadata:
            yield f"{prefix}{f.name}", f.metadata[NEUTRAL]
        elif dataclasses.is_dataclass(f.default_factory):
            yield from _neutral_fields(f.default_factory, f"{prefix}{f.name}.")


def neutral_overrides() -> list[str]:
    """Every field of today's schema that declares a neutral value, set to it: the point as it was measured
    before those fields existed."""
    groups = group_types()
    return [
        f"{path}={'null' if value is None else str(value).lower() if isinstance(value, bool) else value}"
        for group in EXPERIMENT_GROUPS
        for path, value in _neutral_fields(groups[group], f"{group}.")
    ]


@pytest.mark.parametrize("key", GOLDEN)
def test_the_keys_of_stores_written_before_are_pinned(key):
    assert job_key(compose_point([*GOLDEN[key], *neutral_overrides()])) == key


def upgraded(group: str, base: type, name: str, kind: type, default: Any, neutral: Any) -> type:
    """The primary config's schema with one field added to `group` (whose dataclass is `base`), as an upgrade
    adds it: a default, and the value at which it changes nothing that was measured before."""
    added = dataclasses.make_dataclass(
        base.__name__, [(name, kind, dataclasses.field(default=default, metadata={NEUTRAL: neutral}))], bases=(base,)
    )
    return dataclasses.make_dataclass(
        "ExperimentConfig", [(group, added, dataclasses.field(default_factory=added))], bases=(ExperimentConfig,)
    )


def with_value(cfg: ExperimentConfig, group: str, name: str, value: Any, schema: type) -> Any:
    """`cfg` read into the upgraded `schema`, with the added field `group.name` set to `value`."""
    plain = cfg.to_dict()
    return schema.from_dict({**plain, group: {**plain[group], name: value}})


@pytest.mark.parametrize("key", GOLDEN)
def test_a_field_added_at_its_neutral_value_keeps_every_key_and_any_other_value_makes_a_new_one(key):
    cfg = compose_point([*GOLDEN[key], *neutral_overrides()])
    schema = upgraded("parallel", ParallelConfig, "overlap_optimizer", str, "off", neutral="off")
    assert job_key(with_value(cfg, "parallel", "overlap_optimizer", "off", schema)) == key
    assert job_key(with_value(cfg, "parallel", "overlap_optimizer", "on", schema)) != key
    # clipping changes the step: a default other than the neutral value makes new keys, and the neutral one finds
    # what was measured before it existed
    clipped = upgraded("train", TrainConfig, "clip_at", float, 1.0, neutral=0.0)
    assert job_key(with_value(cfg, "train", "clip_at", 1.0, clipped)) != key
    assert job_key(with_value(cfg, "train", "clip_at", 0.0, clipped)) == key
    assert job_key(with_value(cfg, "train", "clip_at", 0, clipped)) == key  # as YAML may spell it


def test_a_field_added_to_a_nested_group_at_its_neutral_value_keeps_the_key():
    cfg = compose_point()
    data = dataclasses.make_dataclass(
        "DataConfig",
        [("shuffle", bool, dataclasses.field(default=False, metadata={NEUTRAL: False}))],
        bases=(DataConfig,),
    )
    train = dataclasses.make_dataclass(
        "TrainConfig", [("data", data, dataclasses.field(default_factory=data))], bases=(TrainConfig,)
    )
    schema = dataclasses.make_dataclass(
        "ExperimentConfig", [("train", train, dataclasses.field(default_factory=train))], bases=(ExperimentConfig,)
    )
    for shuffle, same in ((False, True), (True, False)):
        upgraded_cfg = with_value(cfg, "train", "data", {**cfg.to_dict()["train"]["data"], "shuffle": shuffle}, schema)
        assert (job_key(upgraded_cfg) == job_key(cfg)) is same


def ok_record(cfg: ExperimentConfig, key: str) -> Record:
    """An ok record of one launch, as run_point writes it."""
    metrics = {"tokens_per_s": 1000.0, "tokens_per_s_per_gpu": 1000.0, "step_time_s": 0.128}
    return Record(
        job_key=key,
        sweep=cfg.sweep,
        status=Status.OK,
        config=cfg.experiment(),
        metrics=metrics,
        repeats=[Launch(status=Status.OK, metrics=metrics)],
    )


def test_a_store_written_before_a_field_was_added_answers_the_point_after_it(tmp_path):
    before = compose_point(GOLDEN["fae2dc172e68"], sweep_dir=tmp_path)
    ok_record(before, job_key(before)).write(job_dir(tmp_path, job_key(before)) / RESULT_FILE)
    schema = upgraded("parallel", ParallelConfig, "overlap_optimizer", str, "off", neutral="off")
    after = with_value(before, "parallel", "overlap_optimizer", "off", schema)
    key = job_key(after)
    record = read_record(tmp_path, key)
    assert record is not None and answers(record, key, after.launch)
    # a new value of the field is a new point: the store has nothing for it
    assert read_record(tmp_path, job_key(with_value(before, "parallel", "overlap_optimizer", "on", schema))) is None


def test_run_point_answers_a_point_of_a_store_written_before_from_the_store(tmp_path, capsys):
    """The record at the pinned key answers the point today: run_point returns it and launches nothing."""
    key = "fae2dc172e68"
    cfg = compose_point([*GOLDEN[key], *neutral_overrides(), "logger=none"], sweep_dir=tmp_path)
    stored = ok_record(cfg, key).to_dict()
    Record.from_dict(stored).write(job_dir(tmp_path, key) / RESULT_FILE)
    assert run_point(cfg) == stored
    assert f"{key} already recorded as ok: skipped" in capsys.readouterr().out
    assert sorted(p.name for p in job_dir(tmp_path, key).iterdir()) == [RESULT_FILE]  # no config.json, no marker


def test_a_points_log_line_tells_apart_what_its_layout_does_not():
    """`[scaling] key ok ... (model=... dp=1 zero=0)`: two points of one layout that differ in precision or
    recomputation read apart in the job's log; the defaults (fp32, none) are left out."""
    from scaling.job.run import _summary_line
    from tests.helpers.records import make_record

    line = _summary_line(Record.from_dict(make_record(precision="bf16", recompute="full")))
    assert line.endswith("dp=1 zero=0 precision=bf16 recompute=full)"), line
    plain = _summary_line(Record.from_dict(make_record(precision="fp32")))
    assert "precision" not in plain and "recompute" not in plain and plain.endswith("zero=0)"), plain


def test_an_invalid_point_run_again_says_why_it_was_invalid(tmp_path, capsys):
    """Its re-run said only "already recorded as invalid: skipped", and the user had to open the record for why."""
    cfg = compose_point(["model=tiny", "train.seq_len=4096", "logger=none"], sweep_dir=tmp_path)
    first = run_point(cfg)
    assert first["status"] == Status.INVALID and "train.seq_len=4096" in first["error"]
    capsys.readouterr()
    assert run_point(cfg) == first
    assert f"{first['job_key']} already recorded as invalid ({first['error']}): skipped" in capsys.readouterr().out
