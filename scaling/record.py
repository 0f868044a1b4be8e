"""The record store: one `<sweep_dir>/<job_key>/result.json` per experiment point.

Owns the job key (a stable hash of the experiment-defining config), the statuses, and the atomic
write (temp file + `os.replace`), so a killed driver never leaves half a record behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from scaling.config import EXPERIMENT_GROUPS

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"

OK, OOM, PREDICTED_OOM, TIMEOUT, FAILED, INVALID = "ok", "oom", "predicted_oom", "timeout", "failed", "invalid"
STATUSES = (OK, OOM, PREDICTED_OOM, TIMEOUT, FAILED, INVALID)
FINAL_STATUSES = frozenset({OK, OOM, PREDICTED_OOM, INVALID})
"""A re-run skips these; `failed` and `timeout` are retried only when asked (launch.rerun)."""


def experiment_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that defines what is measured (model, train, parallel, hardware)."""
    return {group: dict(cfg[group]) for group in EXPERIMENT_GROUPS}


def job_key(cfg: Mapping[str, Any]) -> str:
    """Short stable hash of the experiment-defining config; logging and launch settings do not count."""
    canonical = json.dumps(experiment_config(cfg), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def job_dir(sweep_dir: str | os.PathLike, key: str) -> Path:
    """Folder of one point inside a sweep directory."""
    return Path(sweep_dir) / key


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON so that readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_record(sweep_dir: str | os.PathLike, key: str) -> Optional[dict[str, Any]]:
    """The record of a point, or None if it has none (or only an unreadable one)."""
    path = job_dir(sweep_dir, key) / RESULT_FILE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def iter_records(sweep_dir: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Every readable record directly under a sweep directory."""
    for path in sorted(Path(sweep_dir).glob(f"*/{RESULT_FILE}")):
        try:
            yield json.loads(path.read_text())
        except json.JSONDecodeError:
            continue


def should_skip(record: Optional[Mapping[str, Any]], rerun: str) -> bool:
    """Whether a stored record answers the point: final statuses always, failed/timeout unless rerun."""
    if record is None or rerun == "all":
        return False
    if rerun == "failed":
        return record.get("status") in FINAL_STATUSES
    return record.get("status") in STATUSES
