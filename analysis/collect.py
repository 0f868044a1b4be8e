"""Records -> one tidy pandas DataFrame: one row per experiment point, short column names.

Owns the mapping from the nested record (and from a W&B run's config and summary) to flat columns, so every other
part of `analysis` speaks in one set of names: the config axes (from scaling.core.schema.config_fields), `status`,
the metrics (from the typed block, scaling.store.record_blocks), the predictions and the timing. Dtypes say what a
column is: `status` an ordered category, `model` ordered by parameter count, timestamps UTC, counts nullable
integers. A record the analysis cannot use (analysis.usable) is left out and named, never a reason to fail.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import pandas as pd

from analysis.usable import LeftOut, record_problem
from scaling.core.enums import Status
from scaling.core.schema import EXPERIMENT_GROUPS, config_fields
from scaling.core.units import GIB, MIB
from scaling.store.read import RecordError, iter_records
from scaling.store.record_blocks import derived_columns, metric_columns
from scaling.store.wandb_runs import (
    MEMORY,
    RECORD_BLOCKS,
    SUMMARY_BLOCKS,
    TOP_LEVEL,
    flat,
    read_offline_run,
)

STATUS_ORDER = [status.value for status in Status]
"""The `status` category's order (scaling.core.enums.Status), as the plain strings records hold."""

CONFIG_FIELDS = config_fields()
"""The experiment config's fields (scaling.core.schema): one column each, a field added there is a column here."""
METRIC_COLUMNS = metric_columns()
"""The record's metrics the table has (scaling.store.record_blocks.Metrics), with their annotations."""

# (column, path in the record). A later path wins when both exist: `derived` holds the values the
# engine resolved (grad_acc: auto -> 4), `config` the values asked for; `target_gbs*` (train.gbs*) keep the
# global batch a sweep fixed (null when grad_acc was given and the batch follows from dp).
FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    *((c.column, ("config", *c.path)) for c in CONFIG_FIELDS),
    ("gbs", ("config", "train", "gbs")),
    ("gbs_tokens", ("config", "train", "gbs_tokens")),
    # the typed derived block (a model the user brings: its blocks and parameter tensors too)
    *((name, ("derived", *path)) for name, path in derived_columns()),
    *((name, ("metrics", name)) for name, _ in METRIC_COLUMNS),
    ("pred_peak_mem_bytes", ("predicted", "peak_mem_bytes")),
    ("pred_method", ("predicted", "method")),
    ("pred_fits", ("predicted", "fits")),
    ("pred_analytic_peak_mem_bytes", ("predicted", "analytic", "peak_mem_bytes")),
    ("pred_traced_peak_mem_bytes", ("predicted", "traced", "peak_mem_bytes")),
    ("pred_sampled", ("predicted", "sampled")),
    ("torch_version", ("env", "torch")),
    ("device_name", ("env", "device_name")),
    ("backend", ("env", "backend")),
    ("hostname", ("env", "hostname")),
    ("oversubscribed", ("env", "oversubscribed")),
    ("memory_capacity", ("env", "memory_capacity")),
    ("started_at", ("timing", "started_at")),
    ("launched_at", ("timing", "launched_at")),
    ("wall_s", ("timing", "wall_s")),
    ("launch_overhead_s", ("timing", "launch_overhead_s")),
    ("torchrun_wall_s", ("timing", "torchrun_wall_s")),
    ("device_s", ("timing", "device_s")),
    ("timed_device_s", ("timing", "timed_device_s")),
    ("warmup_device_s", ("timing", "warmup_device_s")),
    ("startup_device_s", ("timing", "startup_device_s")),
)
HEAD = ("sweep", "job_key", "status", "error", "schema_version")
COLUMNS: tuple[str, ...] = HEAD + tuple(dict.fromkeys(name for name, _ in FIELDS))
"""Every column of `collect`'s DataFrame, in order."""

CONFIG_AXES = (*(c.column for c in CONFIG_FIELDS if c.axis), "gbs", "gbs_tokens")
"""Columns that say which point was measured (heatmap axes; less dp and grad_acc, the DP-scaling groups): every
experiment field of the schema but the run-only ones, and the global batch dp and grad_acc give."""
NEUTRAL_FILL = {c.column: c.neutral for c in CONFIG_FIELDS if c.neutral is not None}
"""A config field a record lacks was measured at its neutral value (it did not exist yet): grad_clip 0."""

INT_COLUMNS = (
    *(c.column for c in CONFIG_FIELDS if c.type in ("int", "Optional[int]")),
    *(name for name, kind in METRIC_COLUMNS if kind in ("int", "Optional[int]")),
    "grad_acc",
    "gbs",
    "gbs_tokens",
    "n_params",
    "flops_per_token",
    "hw_flops_per_token",
    "world_size",
    "n_blocks",
    "pred_peak_mem_bytes",
    "pred_analytic_peak_mem_bytes",
    "pred_traced_peak_mem_bytes",
)
FLOAT_COLUMNS = (
    *(c.column for c in CONFIG_FIELDS if c.type in ("float", "Optional[float]")),
    *(name for name, kind in METRIC_COLUMNS if kind in ("float", "Optional[float]")),
    "wall_s",
    "launch_overhead_s",
    "torchrun_wall_s",
    "device_s",
    "timed_device_s",
    "warmup_device_s",
    "startup_device_s",
)
TIME_COLUMNS = ("started_at", "launched_at")
"""ISO-8601 strings in the record, UTC datetimes in the DataFrame."""


def _dig(record: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = record
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def record_to_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten one record into the row `collect` makes of it."""
    status = record.get("status")
    if status not in STATUS_ORDER:
        raise ValueError(f"record {record.get('job_key')!r}: status={status!r} is not one of {', '.join(STATUS_ORDER)}")
    row: dict[str, Any] = {key: record.get(key) for key in HEAD}
    for name, path in FIELDS:
        value = _dig(record, path)
        if value is not None or name not in row:
            row[name] = value
    for name, neutral in NEUTRAL_FILL.items():
        if row[name] is None:
            row[name] = neutral
    if row["grad_acc"] == "auto":  # an invalid point never got a derived grad_acc
        row["grad_acc"] = None
    return row


def model_order(df: pd.DataFrame) -> list[str]:
    """Model names by parameter count (smallest first), ties and models never sized by name."""
    sizes = df.groupby("model", dropna=True)["n_params"].min()
    return sorted(
        sizes.index, key=lambda name: (pd.isna(sizes[name]), 0 if pd.isna(sizes[name]) else sizes[name], name)
    )


def to_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows -> DataFrame with `COLUMNS` in order, nullable integers, status and model as ordered
    categories, timestamps as UTC datetimes."""
    df = pd.DataFrame.from_records(list(rows), columns=list(COLUMNS))
    for column in INT_COLUMNS:
        df[column] = pd.to_numeric(df[column], errors="coerce").astype("Int64")
    for column in FLOAT_COLUMNS:
        df[column] = pd.to_numeric(df[column], errors="coerce").astype("float64")
    df["status"] = pd.Categorical(df["status"], categories=STATUS_ORDER, ordered=True)
    df["model"] = pd.Categorical(df["model"], categories=model_order(df), ordered=True)
    for column in TIME_COLUMNS:
        df[column] = pd.to_datetime(df[column], utc=True, format="ISO8601")
    for prefix in ("", "pred_"):
        peak = df[f"{prefix}peak_mem_bytes"].astype("float64")
        df[f"{prefix}peak_mem_gib"], df[f"{prefix}peak_mem_mib"] = peak / GIB, peak / MIB
    return df


def collect(*sweep_dirs: str | os.PathLike, left_out: Optional[list[LeftOut]] = None) -> pd.DataFrame:
    """Every usable record under the given sweep directories as one DataFrame, one row per point.

    A record the analysis cannot use (`analysis.usable.record_problem`) is left out: appended to `left_out`
    when given, else named on stderr, one line each."""
    if not sweep_dirs:
        raise ValueError("collect() needs at least one sweep directory")
    rows, unusable = [], []
    for sweep_dir in sweep_dirs:
        if not Path(sweep_dir).is_dir():
            raise ValueError(
                f"sweep_dir={str(sweep_dir)!r} is not a directory: pass a folder holding <job_key>/result.json records"
            )
        unreadable: list[RecordError] = []
        for record in iter_records(sweep_dir, unreadable):
            problem = record_problem(record)
            if problem is None:
                rows.append(record_to_row(record))
            else:
                key = record.get("job_key") if isinstance(record, dict) else None
                unusable.append(LeftOut(str(key or "?"), problem))
        unusable += [LeftOut(e.path.parent.name, f"{e.path}: {e.reason}") for e in unreadable]
    if left_out is not None:
        left_out.extend(unusable)
    else:
        for one in unusable:
            print(f"[analysis] {one.line()}", file=sys.stderr)
    return to_frame(rows)


def to_parquet(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write the DataFrame as Parquet (list columns such as `losses` included) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.replace("/", ".").split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[leaf] = value
    return nested


def run_record(config: Mapping[str, Any], summary: Mapping[str, Any], group: Optional[str] = None) -> dict[str, Any]:
    """The record a W&B run's config and summary hold (nested, dotted or slash keys alike).

    The config holds the experiment config (`model`, `train`, `parallel`, `hardware`) and `derived`,
    `env`, `provenance`; the summary `status`, `error`, `job_key` and the sections `metrics`, `memory`
    (back into `metrics`), `predicted` and `timing`. Figures at the summary's top level (runs logged
    by other tools) fill what the sections leave empty.
    """
    flat_config = {k: v for k, v in flat("", config).items() if not k.startswith("_")}
    flat_summary = {k: v for k, v in flat("", summary).items() if not k.startswith("_")}
    nested = _nest({**flat_config, **flat_summary})
    record: dict[str, Any] = {"config": {g: nested.get(g) for g in EXPERIMENT_GROUPS}}
    for section in ("metrics", *RECORD_BLOCKS, *SUMMARY_BLOCKS):
        record[section] = dict(nested.get(section) or {})
    record["metrics"].update(nested.get(MEMORY) or {})
    for _, (section, *path) in FIELDS:
        if section in ("metrics", "derived") and record[section].get(path[0]) is None:
            record[section][path[0]] = _first(nested.get(path[0]))
    for key in TOP_LEVEL:
        record[key] = nested.get(key)
    record["sweep"] = _first(nested.get("sweep"), group)
    return record


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None and not isinstance(v, Mapping)), None)


def latest_attempts(runs: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Runs ({id, config, summary, group, job_type}, oldest first) as a `collect`-shaped DataFrame with
    `wandb_run_id`: one row per point, from the run of its latest attempt (a later run of the same
    attempt wins), in job-key order as `collect` gives them. Report runs and runs without a status
    are left out."""
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    for run in runs:
        if run.get("job_type") == "report":
            continue
        record = run_record(run["config"], run["summary"], run.get("group"))
        if record["status"] is None:
            continue
        attempt = int(record["provenance"].get("attempt") or 1)
        if record["job_key"] not in latest or attempt >= latest[record["job_key"]][0]:
            latest[record["job_key"]] = (attempt, {**record_to_row(record), "wandb_run_id": run["id"]})
    rows = [row for _, (_, row) in sorted(latest.items())]
    df = to_frame(rows)
    df["wandb_run_id"] = [row["wandb_run_id"] for row in rows]
    return df


def from_wandb(project: str, group: str, entity: Optional[str] = None) -> pd.DataFrame:
    """The runs of one sweep (W&B group) as a `collect`-shaped DataFrame: the latest attempt of each point."""
    import wandb

    path = f"{entity}/{project}" if entity else project
    runs = wandb.Api().runs(path, filters={"group": group}, order="+created_at", lazy=False)
    return latest_attempts(
        {
            "id": run.id,
            "config": dict(run.config),
            "summary": dict(run.summary_metrics),
            "group": group,
            "job_type": getattr(run, "job_type", None),
        }
        for run in runs
    )


def from_wandb_offline(sweep_dir: str | os.PathLike, wandb_dir: Optional[str | os.PathLike] = None) -> pd.DataFrame:
    """A sweep's offline W&B runs (`<sweep_dir>/wandb`, or `logger.dir`'s `wandb` folder) as a
    `collect`-shaped DataFrame, read from their `.wandb` files: equal to `collect(sweep_dir)` plus
    `wandb_run_id` once every point was logged."""
    folder = Path(wandb_dir if wandb_dir is not None else sweep_dir) / "wandb"
    if not folder.is_dir():
        raise ValueError(
            f"no W&B folder at {str(folder)!r}: log the sweep with logger=wandb (offline by default), "
            "or pass wandb_dir= the logger.dir it used"
        )
    files = sorted(folder.glob("offline-run-*/run-*.wandb"))  # offline-run-<start time>-<id>: oldest first
    return latest_attempts(read_offline_run(path) for path in files)
