"""Reading records: the one loader every reader goes through (the sweepers, run_point, the recipe, status, the
report, the search), which names the path and the reason of a record it cannot read, stops at a record of a newer
scaling, and sets a corrupt one aside (renamed beside it, never overwritten) when its point is about to run again."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from scaling.engine.jobfiles import RESULT_FILE
from scaling.store.record import SCHEMA_VERSION, job_dir


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


def load_record(path: Path) -> dict[str, Any]:
    """The record in `path`: FileNotFoundError when there is none, RecordError naming the path and the reason when
    it cannot be read as one, NewerRecord when a newer scaling wrote it. Every reader of records reads through
    here (the sweepers, run_point, the recipe, status, the report)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
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
    return data


def set_aside(e: RecordError) -> Optional[Path]:
    """Rename a corrupt record out of the point's way (never over another file); its new path, or None when it could
    not be moved (it then stays where it is and its point is not run)."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    target = e.path.with_name(f"{e.path.name}{SET_ASIDE}{stamp}-{os.getpid()}")
    try:
        os.link(e.path, target)  # fails rather than replace an existing file
        os.unlink(e.path)
    except OSError:
        return None
    return target


def set_aside_records(sweep_dir: str | os.PathLike) -> list[RecordError]:
    """The records set aside under a sweep directory (`set_aside`), each as the problem it was."""
    return [RecordError(p, SET_ASIDE_REASON) for p in sorted(Path(sweep_dir).glob(f"*/{RESULT_FILE}{SET_ASIDE}*"))]


def read_record(sweep_dir: str | os.PathLike, key: str, set_aside_corrupt: bool = False) -> Optional[dict[str, Any]]:
    """The record of a point, or None if it has none. RecordError when it has one that cannot be read; with
    `set_aside_corrupt` (a run that is about to record the point) a corrupt one is set aside first, said on stderr,
    and the point has none."""
    path = job_dir(sweep_dir, key) / RESULT_FILE
    try:
        return load_record(path)
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
    for path in sorted(Path(sweep_dir).glob(f"*/{RESULT_FILE}")):
        try:
            yield load_record(path)
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
