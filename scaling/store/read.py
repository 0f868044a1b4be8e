"""Reading records: the one loader every reader goes through (the sweepers, run_point, the recipe, status, the
report, the search), which names the path and the reason of a record it cannot read, stops at a record of a newer
scaling, and sets a corrupt one aside (renamed beside it, never overwritten) when its point is about to run again.

A record is its folder's: read from a store, one whose `job_key`, or whose config's key, is not its folder's (a record
copied or linked there from another point) is no record of that point, and neither is a JSON object of another shape
or a dangling link; each is named and set aside like a corrupt one. A directory, a pipe or a file that cannot be read
is left as it is.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from scaling.core.schema import ExperimentConfig
from scaling.engine.jobfiles import RESULT_FILE
from scaling.store.record import SCHEMA_VERSION, job_dir, job_key


class RecordError(ValueError):
    """A record file that cannot be read as a record: its path and why. `corrupt` when its bytes are there but not a
    record (not UTF-8, not whole JSON, not an object): written atomically, a record is never half there, so such a
    file is damage, set aside by the run that finds it; otherwise (it cannot be read at all: another user's 0600
    file, a directory) it is left as it is."""

    def __init__(self, path: Path, reason: str, corrupt: bool = False) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.corrupt = path, reason, corrupt


class NewerRecord(ValueError):
    """A record of a newer schema_version: this scaling must not read it (nor rewrite it at its own). Not a
    RecordError: a reader that handles records it cannot read lets this one stop the command."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


SET_ASIDE = ".unreadable-"
"""A record set aside is renamed `result.json.unreadable-<UTC time>-<pid>` in its point's folder."""
SET_ASIDE_REASON = "set aside: a record that could not be read (its point ran again)"


def load_record(path: Path, key: Optional[str] = None) -> dict[str, Any]:
    """The record in `path`: FileNotFoundError when there is none, RecordError naming the path and the reason when
    it cannot be read as one, NewerRecord when a newer scaling wrote it. With `key`, the point whose folder holds
    the file (every reader of a store passes it), a record of another point is a RecordError too. Every reader of
    records reads through here (the sweepers, run_point, the recipe, status, the report)."""
    try:
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise RecordError(path, f"is a symbolic link to {os.readlink(path)}, which does not exist", True) from None
        raise
    except OSError as e:
        raise RecordError(path, f"cannot be read ({e.strerror or type(e).__name__}): left as it is") from e
    if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):  # a pipe would block the reader
        raise RecordError(path, "is not a regular file (a pipe, a socket or a device): left as it is")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise RecordError(path, f"cannot be read ({e.strerror or type(e).__name__}): left as it is") from e
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise RecordError(path, f"is not UTF-8 text (byte {e.start} is {raw[e.start]:#04x})", corrupt=True) from e
    except json.JSONDecodeError as e:
        raise RecordError(path, f"is not whole JSON ({e.msg} at line {e.lineno} column {e.colno})", True) from e
    if not isinstance(data, dict):
        raise RecordError(path, f"holds a JSON {type(data).__name__}, not a record (an object)", corrupt=True)
    version = data.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise NewerRecord(
            path,
            f"schema_version={version}: this store was written by a newer scaling (this one reads up to "
            f"{SCHEMA_VERSION}): upgrade scaling to read it",
        )
    problem = _not_a_record(data) or (None if key is None else _not_its_folders(data, key))
    if problem is not None:
        raise RecordError(path, problem, corrupt=True)
    return data


def _not_a_record(data: dict[str, Any]) -> Optional[str]:
    """Why a JSON object is not a record (a record names its point: a job_key), or None."""
    if isinstance(data.get("job_key"), str):
        return None
    keys = ", ".join(sorted(map(str, data))[:6]) or "none"
    return f"holds a JSON object that is not a record (no job_key; its keys: {keys})"


def _not_its_folders(data: dict[str, Any], key: str) -> Optional[str]:
    """Why a record is not the one of the point whose folder (`key`) holds it, or None: its job_key, or its config's
    key, is another point's. A config this scaling cannot read (none, or a field it lacks: an older or newer schema's)
    is not keyed, only its job_key compared."""
    if data["job_key"] != key:
        return f"holds the record of point {data['job_key']}, not of its folder's point {key} (copied or linked here)"
    try:
        keyed = job_key(ExperimentConfig.from_dict(data["config"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if keyed != key:
        return f"says job_key {key}, but its config is the one of point {keyed} (edited, or copied from another point)"
    return None


def set_aside(e: RecordError) -> Optional[Path]:
    """Rename a corrupt record out of the point's way (never over another file); its new path, or None when it could
    not be moved (it then stays where it is and its point is not run)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    target = e.path.with_name(f"{e.path.name}{SET_ASIDE}{stamp}-{os.getpid()}")
    try:
        os.link(e.path, target, follow_symlinks=False)  # fails rather than replace a file; a link moves as itself
        os.unlink(e.path)
    except OSError:
        return None
    return target


def set_aside_records(sweep_dir: str | os.PathLike) -> list[RecordError]:
    """The records set aside under a sweep directory (`set_aside`), each as the problem it was."""
    return [RecordError(p, SET_ASIDE_REASON) for p in sorted(Path(sweep_dir).glob(f"*/{RESULT_FILE}{SET_ASIDE}*"))]


def record_paths(sweep_dir: str | os.PathLike) -> list[Path]:
    """Where the records of a sweep directory are, or should be: `<key>/result.json` of each point's folder, in key
    order, dangling links included (a glob follows links and would leave them out)."""
    try:
        folders = sorted(e.name for e in os.scandir(sweep_dir) if e.is_dir() and not e.name.startswith("."))
    except FileNotFoundError:
        return []
    paths = (Path(sweep_dir) / name / RESULT_FILE for name in folders)
    return [path for path in paths if os.path.lexists(path)]


def read_record(sweep_dir: str | os.PathLike, key: str, set_aside_corrupt: bool = False) -> Optional[dict[str, Any]]:
    """The record of a point, or None if it has none. RecordError when it has one that cannot be read; with
    `set_aside_corrupt` (a run that is about to record the point) a corrupt one is set aside first, said on stderr,
    and the point has none."""
    path = job_dir(sweep_dir, key) / RESULT_FILE
    try:
        return load_record(path, key)
    except FileNotFoundError:
        return None
    except RecordError as e:
        if not (set_aside_corrupt and e.corrupt):
            raise
        moved = set_aside(e)
        if moved is None:
            raise
        print(f"[scaling] {e}: set aside as {moved.name}; the point runs again", file=sys.stderr, flush=True)
        return None


def iter_records(
    sweep_dir: str | os.PathLike, problems: Optional[list[RecordError]] = None
) -> Iterator[dict[str, Any]]:
    """Every readable record directly under a sweep directory. Each that cannot be read, and each set aside earlier,
    is appended to `problems` (named on stderr when None); a record of a newer schema raises NewerRecord."""
    found = []
    for path in record_paths(sweep_dir):
        try:
            yield load_record(path, path.parent.name)
        except FileNotFoundError:
            continue
        except RecordError as e:
            found.append(e)
    found += set_aside_records(sweep_dir)
    if problems is not None:
        problems.extend(found)
    else:
        for e in found:
            print(f"[scaling] {e}", file=sys.stderr)
