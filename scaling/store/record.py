"""The record store: one `<sweep_dir>/<job_key>/result.json` per experiment point.

Owns the job key (a stable hash of the experiment-defining config), the resume rule (`answers`: which
stored records answer a point, and which of its launches a new run keeps), and the atomic write (temp
file + `os.replace`), so a killed driver never leaves half a record behind. The statuses are
scaling.engine.enums.Status.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from scaling.core.sample import sampled
from scaling.core.schema import EXPERIMENT_GROUPS
from scaling.engine.enums import FINAL, Status
from scaling.engine.jobfiles import RESULT_FILE, read_json

SCHEMA_VERSION = 1
SWEEP_INDEX = "sweep.json"
"""The sweep directory's index: name, start, hardware and one entry per run of the sweep."""


def experiment_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that defines what is measured (model, train, parallel, hardware)."""
    return {group: dict(cfg[group]) for group in EXPERIMENT_GROUPS}


def job_key(cfg: Mapping[str, Any]) -> str:
    """Short stable hash of the experiment-defining config; logging and launch settings do not count."""
    canonical = json.dumps(experiment_config(cfg), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def output_dir(sweep_dir: str, hydra: Any) -> str:
    """The sweep's one folder, absolute: `hydra.sweep.dir` in a multirun (it defaults to `${sweep_dir}`, so
    overriding either moves records, sweep.json, the study and best.yaml together), else `sweep_dir`.

    `hydra` is the composed `hydra` node (HydraConfig.get() in a job, cfg.hydra in a sweeper)."""
    from hydra.types import RunMode

    chosen = hydra.sweep.dir if hydra.mode == RunMode.MULTIRUN else sweep_dir
    return os.path.join(hydra.runtime.cwd, chosen)  # an absolute `chosen` stays as it is


def job_dir(sweep_dir: str | os.PathLike, key: str) -> Path:
    """Folder of one point inside a sweep directory."""
    return Path(sweep_dir) / key


def read_record(sweep_dir: str | os.PathLike, key: str) -> Optional[dict[str, Any]]:
    """The record of a point, or None if it has none (or only an unreadable one)."""
    return read_json(job_dir(sweep_dir, key) / RESULT_FILE)


def iter_records(sweep_dir: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Every readable record directly under a sweep directory."""
    for path in sorted(Path(sweep_dir).glob(f"*/{RESULT_FILE}")):
        try:
            yield json.loads(path.read_text())
        except json.JSONDecodeError:
            continue


def next_attempt(previous: Optional[Mapping[str, Any]]) -> int:
    """The attempt number of a new record of a point: 1, or one more than the record it replaces."""
    if previous is None:
        return 1
    return int((previous.get("provenance") or {}).get("attempt") or 1) + 1


def ok_launches(record: Optional[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ok launches a stored record holds: its `repeats` entries of status ok (a record written
    before repeats were kept counts its one ok launch)."""
    if record is None:
        return []
    if isinstance(record.get("repeats"), list):
        return [dict(launch) for launch in record["repeats"] if launch.get("status") == Status.OK]
    if record.get("status") == Status.OK and record.get("metrics"):
        return [{"status": Status.OK, "error": None, "metrics": record["metrics"],
                 "timing": dict(record.get("timing") or {})}]
    return []


def kept_launches(record: Optional[Mapping[str, Any]], rerun: str) -> list[dict[str, Any]]:
    """The launches a new run of a point keeps: the stored ok ones (none with launch.rerun=all)."""
    return [] if rerun == "all" else ok_launches(record)


def answers(record: Optional[Mapping[str, Any]], key: str, launch: Mapping[str, Any]) -> bool:
    """Whether a stored record answers its point, so that it is not run again: ok with at least
    launch.repeats ok launches (an ok point with fewer launches the missing ones), predicted_oom unless the
    pre-screen's sample (launch.prescreen_sample) runs the point anyway, invalid and oom always, failed and
    timeout unless launch.rerun=failed; none with launch.rerun=all. run_point, the grid and Optuna sweepers
    and `scaling status` all decide by it."""
    if record is None or launch["rerun"] == "all":
        return False
    status = record.get("status")
    if status == Status.OK:
        return len(ok_launches(record)) >= launch["repeats"]
    if status == Status.PREDICTED_OOM and sampled(key, float(launch["prescreen_sample"])):
        return False
    return status in FINAL or (launch["rerun"] != "failed" and status in (Status.FAILED, Status.TIMEOUT))


def launches_timing(launches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The record's launch timing over the launches of one run of the driver: the first start, and the
    device wait, torchrun wall and launch overhead summed (each launch keeps its own in `repeats`)."""
    def total(key: str) -> Optional[float]:
        values = [launch["timing"][key] for launch in launches if launch["timing"].get(key) is not None]
        return sum(values) if values else None

    return {"launched_at": launches[0]["timing"]["launched_at"] if launches else None,
            **{key: total(key) for key in ("device_wait_s", "torchrun_wall_s", "launch_overhead_s")}}
