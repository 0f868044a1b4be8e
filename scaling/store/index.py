"""The sweep index, `<sweep_dir>/sweep.json`: its updates under a lock, and the store's id.

    {"name", "created_at", "store_id", "hardware", "runs": [one entry per multirun started on the store]}

Several drivers may start on one store at once (two terminals, a team on a shared file system): each update
reads, changes and writes the index holding an exclusive flock on `.sweep.json.lock` beside it, so no
driver's run is lost to another's write.

The store id names the store in W&B run ids (scaling.store.wandb_runs.run_id), so two stores of one sweep
name log to runs of their own. It is the hash of the store's resolved path, kept in sweep.json from the
first update on: a store moved or copied with its sweep.json keeps its id, and a store without one (single
points only) has the id its sweep.json will get.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from scaling.core.files import read_json, write_json_atomic
from scaling.store.record import SWEEP_INDEX

INDEX_LOCK = f".{SWEEP_INDEX}.lock"
STORE_ID = "store_id"

T = TypeVar("T")


def path_id(sweep_dir: str | os.PathLike) -> str:
    """8 hex digits of the sha256 of the store's resolved path."""
    return hashlib.sha256(str(Path(sweep_dir).resolve()).encode()).hexdigest()[:8]


def store_id(sweep_dir: str | os.PathLike) -> str:
    """The id sweep.json keeps, or, before it keeps one, the one it will get (`path_id`)."""
    index = read_json(Path(sweep_dir) / SWEEP_INDEX)
    if isinstance(index, dict) and index.get(STORE_ID):
        return str(index[STORE_ID])
    return path_id(sweep_dir)


def update_index(sweep_dir: str | os.PathLike, change: Callable[[dict[str, Any]], T]) -> T:
    """Apply `change` to the index (an empty dict when there is none yet) and write it back, all under the
    index lock; returns what `change` returns."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / SWEEP_INDEX
    with open(sweep_dir / INDEX_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        index = json.loads(path.read_text()) if path.exists() else {}
        result = change(index)
        index.setdefault(STORE_ID, path_id(sweep_dir))
        write_json_atomic(path, index)
    return result
