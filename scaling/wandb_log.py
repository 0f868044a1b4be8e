"""Weights & Biases logging of one launched point: the dashboard, never the source of truth.

One run per launched point: group = sweep name, job_type = `throughput`, config = the
experiment config (plus derived sizes), summary = the metrics, history = one row per timed step
(tokens/s, step time, memory). Offline by default. Any W&B failure is reported on stderr and
never fails the point: result.json is written before this runs.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from scaling.record import FAILED, OK, OOM, TIMEOUT

LAUNCHED = (OK, OOM, FAILED, TIMEOUT)


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


def summary_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The run summary: status, error and every scalar metric and prediction."""
    summary: dict[str, Any] = {"status": record["status"], "error": record["error"], "job_key": record["job_key"]}
    for block in ("metrics", "predicted", "timing"):
        for key, value in flat(block, record.get(block) or {}).items():
            if not isinstance(value, (list, dict)):
                summary[key] = value
    return summary


def history_of(record: Mapping[str, Any]) -> list[dict[str, float]]:
    """One history row per timed step."""
    m, d = record.get("metrics") or {}, record.get("derived") or {}
    rows = []
    for step_time in m.get("step_times_s") or []:
        tokens_per_s = d["gbs_tokens"] / step_time
        rows.append({
            "step_time_s": step_time,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_gpu": tokens_per_s / d["world_size"],
            "peak_mem_bytes": m["peak_mem_bytes"],
        })
    return rows


def log_point(record: Mapping[str, Any], logger: Mapping[str, Any], default_dir: str) -> Optional[str]:
    """Log a launched point as one W&B run; returns the run's directory, or None if not logged."""
    if logger["name"] != "wandb" or record["status"] not in LAUNCHED:
        return None
    try:
        import wandb

        run = wandb.init(
            project=logger["project"],
            entity=logger["entity"],
            group=record["sweep"],
            job_type="throughput",
            name=record["job_key"],
            tags=[record["status"]],
            config={**flat("", record["config"]), **flat("derived", record.get("derived") or {})},
            dir=logger["dir"] or default_dir,
            mode=logger["mode"],
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True),
        )
        try:
            for step, row in enumerate(history_of(record)):
                run.log(row, step=step)
            run.summary.update(summary_of(record))
            return str(run.dir)
        finally:
            run.finish()
    except Exception:  # noqa: BLE001 - the dashboard must never fail the point
        print(f"[scaling] W&B logging failed for {record['job_key']} (the record is kept):\n"
              f"{traceback.format_exc(limit=2)}", file=sys.stderr)
        return None


_WANDB_HEADER = b":W&B"
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _log_records(data: bytes) -> Iterator[bytes]:
    """Payloads of a .wandb file: a 7-byte header, then LevelDB-style log records in 32 KiB blocks."""
    if data[:4] != _WANDB_HEADER:
        raise ValueError("not a W&B transaction log (missing ':W&B' header)")
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # too little room for a record header: the block is padded
            pos += _BLOCK - pos % _BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk


def read_offline_run(path: str | Path) -> dict[str, Any]:
    """Group, job type, config, summary and history of an offline run, read from its .wandb file."""
    from wandb.proto import wandb_internal_pb2 as pb

    run: dict[str, Any] = {"group": None, "job_type": None, "name": None, "config": {}, "summary": {}, "history": []}
    for payload in _log_records(Path(path).read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.update(group=rec.run.run_group, job_type=rec.run.job_type, name=rec.run.display_name)
            run["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "summary":
            run["summary"].update({i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "history":
            run["history"].append({i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return run
