"""One definition of a configuration: the schema's fields are the analysis's columns, axes, DP-scaling groups and
the job key's fields, so a field added to the schema is an axis everywhere."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from analysis.collect import COLUMNS, CONFIG_AXES, collect
from analysis.dp_scaling import GROUP_KEYS, scaling_table
from analysis.heatmaps import LAYOUT_AXES
from scaling.core.schema import BATCH_SPLIT, EXPERIMENT_GROUPS, ExperimentConfig, config_fields
from tests.helpers.records import key_of, make_record, write_sweep

FIELDS = config_fields()


def test_the_schema_fields_are_the_columns_the_axes_and_the_groups():
    axes = [c.column for c in FIELDS if c.axis]
    assert [c.column for c in FIELDS if c.column in COLUMNS] == [c.column for c in FIELDS]
    assert [a for a in CONFIG_AXES if a in axes] == axes
    assert set(axes) <= set(LAYOUT_AXES)
    assert set(GROUP_KEYS) == set(axes) - set(BATCH_SPLIT)
    run_only = {c.column for c in FIELDS if not c.axis}
    assert run_only == {"warmup_steps", "steps", "seed", "fault"}
    assert not run_only & (set(CONFIG_AXES) | set(GROUP_KEYS))
    assert {"grad_clip", "fsdp_grad_reduce", "compile", "bucket_mb", "threads_per_device"} <= set(GROUP_KEYS)


def _changed(value, type_name: str):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_other"
    return 7 if "int" in type_name or type_name == "Any" else "other"


@pytest.mark.parametrize("field", FIELDS, ids=lambda c: ".".join(c.path))
def test_every_field_changes_the_job_key(field):
    cfg = {g: v for g, v in dataclasses.asdict(ExperimentConfig()).items() if g in EXPERIMENT_GROUPS}
    node = cfg
    for key in field.path[:-1]:
        node = node[key]
    before = key_of(cfg)
    node[field.path[-1]] = _changed(node[field.path[-1]], field.type)
    assert key_of(cfg) != before


@pytest.mark.subprocess
def test_a_field_added_to_the_schema_is_an_axis_everywhere():
    """A new train field, added the way a maintainer adds one (a dataclass field with a docstring), before the
    analysis is imported: it is a column, a heatmap axis and a DP-scaling group key without another edit."""
    script = textwrap.dedent(
        """
        import dataclasses
        import scaling.core.schema as schema

        @dataclasses.dataclass
        class Train(schema.TrainConfig):
            warmup_ratio: float = 0.0

        schema.ExperimentConfig.__dataclass_fields__["train"].default_factory = Train
        from analysis.collect import COLUMNS, CONFIG_AXES
        from analysis.dp_scaling import GROUP_KEYS
        from analysis.heatmaps import LAYOUT_AXES
        print(*("warmup_ratio" in names for names in (COLUMNS, CONFIG_AXES, GROUP_KEYS, LAYOUT_AXES)))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True"] * 4


def _clip(record: dict, grad_clip) -> dict:
    """The record of the same point at another train.grad_clip (None: written before the field existed)."""
    if grad_clip is None:
        del record["config"]["train"]["grad_clip"]
    else:
        record["config"]["train"]["grad_clip"] = grad_clip
    record["job_key"] = key_of(record["config"])
    return record


def test_a_clipped_and_an_unclipped_run_are_two_configurations(tmp_path):
    """The unclipped run is faster at dp=2; grouped together, the table would keep it as the clipped curve's dp=2."""
    clipped = [_clip(make_record(dp=dp, tokens_per_s_per_gpu_value=v), 1.0) for dp, v in ((1, 1000.0), (2, 800.0))]
    unclipped = [_clip(make_record(dp=dp, tokens_per_s_per_gpu_value=v), 0.0) for dp, v in ((1, 1100.0), (2, 1050.0))]
    older = [_clip(make_record(dp=4, tokens_per_s_per_gpu_value=990.0), None)]  # no clipping then: grad_clip 0
    table = scaling_table(collect(write_sweep(tmp_path / "s", clipped + unclipped + older)))
    curves = {config: list(rows["efficiency"].round(3)) for config, rows in table.groupby("config")}
    assert curves == {
        "tiny, seq 256, ZeRO-0, grad_clip=1.0": [1.0, 0.8],
        "tiny, seq 256, ZeRO-0, grad_clip=0.0": [1.0, round(1050 / 1100, 3), 0.9],
    }


def test_the_metrics_block_is_one_definition():
    """The job writes the fields of scaling.store.record_blocks.Metrics, and the analysis's columns are its fields (less
    those marked as no column), with their dtypes."""
    from dataclasses import fields

    from analysis.collect import FLOAT_COLUMNS, INT_COLUMNS
    from scaling.store.record_blocks import Metrics, metric_columns
    from tests.helpers.launches import launch_metrics

    written = launch_metrics([1.0, 1.1, 0.9], [5, 6])
    assert list(written) == [f.name for f in fields(Metrics)]
    columns = [name for name, _ in metric_columns()]
    assert set(columns) <= set(COLUMNS) and {"tokens_per_s_per_gpu", "noise_band_frac", "losses"} <= set(columns)
    assert "peak_mem_breakdown_rank0" not in COLUMNS  # a dict: kept in the record, not a column
    assert {"peak_mem_bytes", "repeats_ok"} <= set(INT_COLUMNS) and {"mfu", "step_time_s"} <= set(FLOAT_COLUMNS)
