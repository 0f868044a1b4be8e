"""A W&B run is a second copy of a record: the mapping between the two, and the reader of offline runs.

One run per point and attempt, whatever its status: id `<sweep>-<store>-<job_key>-<attempt>` (`run_id`), a name and
tags from the record's axes (`axis_value`), the experiment config and the record's derived, env and provenance
blocks as flat config, its figures as summary sections (`metrics/`, `memory/`, `predicted/`, `timing/`).
scaling.job.wandb_log writes runs this way; analysis.collect reads them back into records' rows (`from_wandb`,
`read_offline_run` for `.wandb` files). Pure mapping and file reading: nothing here logs. docs/sweeps.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator, Mapping

from scaling.core.derived import Derived
from scaling.core.layout import MODEL_PARALLEL, Layout
from scaling.core.schema import EXPERIMENT_GROUPS, config_fields

TOP_LEVEL = ("status", "error", "job_key", "sweep", "schema_version")
"""Record fields kept under their own names in the run summary."""
RECORD_BLOCKS = ("derived", "env", "provenance")
"""Record blocks besides the experiment config that describe the point: they go to the run config."""
CONFIG_BLOCKS = (*EXPERIMENT_GROUPS, *RECORD_BLOCKS)
"""Record blocks that go to the run config, flat (`parallel.dp`, `derived.n_params`, `env.hostname`)."""
SUMMARY_BLOCKS = ("predicted", "timing")
"""Record blocks that go to the run summary as `<block>/<key>`; `metrics` splits into metrics/ and memory/."""
MEMORY = "memory"
"""The summary section of the record's memory metrics (`memory/peak_mem_bytes`): a reader puts them back
into `metrics`."""
AXES = ("model", "seq_len", "mbs", "grad_acc", "dp", "zero_stage")
"""The axes every run is named and tagged by: columns of the experiment config (scaling.core.schema.config_fields);
grad_acc as the record's derived block resolved it (`auto` -> 4) where it has one."""
_FIELDS = {c.column: c.path for c in config_fields()}
_DERIVED = {f.name for f in fields(Derived)}
TAG_CHARS = 64
"""The longest tag W&B takes."""


def flat(prefix: str, tree: Mapping[str, Any]) -> dict[str, Any]:
    """{'train': {'mbs': 2}} -> {'train.mbs': 2}: W&B filters and pandas columns like flat keys."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flat(name, value))
        else:
            out[name] = value
    return out


def axis_value(record: Mapping[str, Any], axis: str) -> Any:
    """The value of one of `AXES` in a record: its derived field when the typed block resolves it (grad_acc), else its
    config's (a derived block, such as the model one brings, is not the axis' value)."""
    derived = record.get("derived")
    value = derived.get(axis) if isinstance(derived, Mapping) and axis in _DERIVED else None
    if value is not None and not isinstance(value, Mapping):
        return value
    node: Any = record.get("config")
    for key in _FIELDS[axis]:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def safe_name(text: str) -> str:
    """`text` with what W&B run ids and artifact names refuse replaced by `_` (at most 40 characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:40]


def run_dir(logger_dir: str | None, sweep_dir: str, environ: Mapping[str, str]) -> str:
    """Where a run's `wandb` folder goes: `logger.dir`, else W&B's own `WANDB_DIR`, else the store."""
    return logger_dir or environ.get("WANDB_DIR") or sweep_dir


def run_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The `wandb.Settings` of a run: quiet (`silent`, `console="off"`) unless the user's `WANDB_SILENT` or
    `WANDB_CONSOLE` says otherwise (W&B then reads them itself), and no system metrics, host facts or list of
    installed packages (the record has its own environment; W&B reading every package's metadata cost a quarter
    of a second per point, a third of the driver's time)."""
    settings: dict[str, Any] = {"x_disable_stats": True, "x_disable_meta": True, "x_save_requirements": False}
    if "WANDB_SILENT" not in environ:
        settings["silent"] = True
    if "WANDB_CONSOLE" not in environ:
        settings["console"] = "off"
    return settings


def run_id(record: Mapping[str, Any], store: str) -> str:
    """`<sweep>-<store>-<job_key>-<attempt>`: one W&B run per point and attempt of one store (the sweep names
    the group). At most 64 characters, W&B's limit: the sweep's name is cut to 32."""
    sweep = safe_name(str(record.get("sweep") or "sweep"))[:32]
    return f"{sweep}-{safe_name(store)}-{record['job_key']}-{attempt_of(record)}"


def attempt_of(record: Mapping[str, Any]) -> int:
    """The record's attempt number (1 for records written before attempts were counted)."""
    return int((record.get("provenance") or {}).get("attempt") or 1)


def layout_axes(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record's parallel axes beyond dp and the stage that are not neutral (`tp`, `dp_shard`, `pp`:
    scaling.core.layout; with pp its `pp_schedule`, and `pp_virtual` where not 1), so that two layouts never share a
    name."""
    parallel = (record.get("config") or {}).get("parallel") or {}
    layout = Layout.of(parallel)
    axes = {"dp_shard": layout.dp_shard, **{axis: getattr(layout, axis) for axis in MODEL_PARALLEL}}
    found = {axis: value for axis, value in axes.items() if value not in (None, 1)}
    if layout.pp > 1:  # a pipeline's schedule and virtual stages tell its runs apart
        found["pp_schedule"] = parallel.get("pp_schedule", "one_f_one_b")
        if (parallel.get("pp_virtual") or 1) > 1:
            found["pp_virtual"] = parallel["pp_virtual"]
    return found


def run_name(record: Mapping[str, Any]) -> str:
    """`tiny seq64 mbs2 ga1 dp2 zero3` (` tp2`, ` dp_shard4`, ` pp2 one_f_one_b`, ` pp_virtual2` where not neutral),
    with ` #2` from the second attempt on."""
    short = {"model": "", "seq_len": "seq", "grad_acc": "ga", "zero_stage": "zero"}
    parts = [f"{short.get(axis, axis)}{axis_value(record, axis)}" for axis in AXES]
    parts += [f"{'' if axis == 'pp_schedule' else axis}{value}" for axis, value in layout_axes(record).items()]
    attempt = attempt_of(record)
    return " ".join(parts) + (f" #{attempt}" if attempt > 1 else "")


def run_tags(record: Mapping[str, Any]) -> list[str]:
    """The status and one `axis=value` tag per axis (the layout's beyond dp where not neutral), each cut to W&B's 64
    characters."""
    tags = [f"{axis}={axis_value(record, axis)}" for axis in AXES]
    tags += [f"{axis}={value}" for axis, value in layout_axes(record).items()]
    return [record["status"]] + [tag[:TAG_CHARS] for tag in tags]


def run_config(record: Mapping[str, Any]) -> dict[str, Any]:
    """The run config: experiment config, derived sizes, environment and provenance, flat."""
    config: dict[str, Any] = {}
    for block in CONFIG_BLOCKS:
        tree = (record.get("config") or {}).get(block) if block in EXPERIMENT_GROUPS else record.get(block)
        config.update(flat(block, tree or {}))
    return config


def summary_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The run summary: the top-level fields, then metrics/, memory/, predicted/ and timing/ sections."""
    summary: dict[str, Any] = {key: record.get(key) for key in TOP_LEVEL}
    for key, value in (record.get("metrics") or {}).items():
        summary[f"{MEMORY if 'mem' in key or 'bytes' in key else 'metrics'}/{key}"] = value
    for block in SUMMARY_BLOCKS:
        for key, value in (record.get(block) or {}).items():
            summary[f"{block}/{key}"] = value
    return summary


_WANDB_HEADER = b":W&B"
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _log_records(data: bytes) -> Iterator[bytes]:
    """Payloads of a .wandb file: a 7-byte header, then LevelDB-style log records in 32 KiB blocks. A record the file
    holds only part of (W&B's service still writing it, after `finish()` returned) ends the payloads: read again later."""
    if data[:4] != _WANDB_HEADER:
        raise ValueError("not a W&B transaction log (missing ':W&B' header)")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # too little room for a record header: the block is padded
            pos += _BLOCK - pos % _BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        end = pos + 7 + length
        if end > len(data):
            return
        chunk, pos = data[pos + 7 : end], end
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk


def read_offline_run(path: str | Path) -> dict[str, Any]:
    """Id, project, group, job type, name, tags, config, summary, history and logged artifacts (name,
    type, file names) of an offline run, read from its .wandb file."""
    from wandb.proto import wandb_internal_pb2 as pb

    run: dict[str, Any] = {
        "id": None,
        "project": None,
        "group": None,
        "job_type": None,
        "name": None,
        "tags": [],
        "config": {},
        "summary": {},
        "history": [],
        "artifacts": [],
    }
    for payload in _log_records(Path(path).read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.update(
                id=rec.run.run_id,
                project=rec.run.project,
                group=rec.run.run_group,
                job_type=rec.run.job_type,
                name=rec.run.display_name,
                tags=list(rec.run.tags),
            )
            run["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "summary":
            run["summary"].update(
                {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update}
            )
        elif kind == "history":
            run["history"].append({i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "artifact":
            run["artifacts"].append(
                {
                    "name": rec.artifact.name,
                    "type": rec.artifact.type,
                    "files": [c.path for c in rec.artifact.manifest.contents],
                }
            )
    return run
