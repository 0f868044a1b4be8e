"""The files of one point's job directory, named once, and the atomic JSON write both sides use.

    <sweep_dir>/<job_key>/config.json     the resolved config the driver hands to the ranks
    <sweep_dir>/<job_key>/worker.json     what rank 0 measured
    <sweep_dir>/<job_key>/torchrun.log    torchrun's and the ranks' output
    <sweep_dir>/<job_key>/elastic/        torch elastic's per-rank error files (@record)
    <sweep_dir>/<job_key>/result.json     the record (scaling.store.record)
    <sweep_dir>/<job_key>/running.json    the point is queued or running, and where (scaling.store.inflight)

Standard library only: the worker and the driver both import it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

CONFIG_FILE = "config.json"
WORKER_OUTPUT = "worker.json"
TORCHRUN_LOG = "torchrun.log"
ELASTIC_LOGS = "elastic"
RESULT_FILE = "result.json"
RUNNING_FILE = "running.json"


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


def read_json(path: str | os.PathLike) -> Optional[Any]:
    """The JSON in `path`, or None when it is missing or not (yet) whole JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
