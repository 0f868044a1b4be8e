"""Files every process writes and reads the same way: JSON written atomically under the user's umask, and read
back as None while it is missing or not yet whole; logs opened without following links; where the shipped data
packages (configs, sweeps) are. Standard library only (the ranks use it too)."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO, Optional

_UMASK_LOCK = threading.Lock()


def package_dir(name: str) -> Path:
    """The directory of one of the project's data packages (`scaling.conf`, `scaling.sweeps`), found through the
    installed package: inside it for a wheel, the repository's conf/ or sweeps/ for an editable install (the
    package-dir mapping in pyproject.toml), never by a path relative to this file."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"{name} is not installed: install the project (`pip install -e .` in the repository, or its wheel)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


CONF_DIR = package_dir("scaling.conf")
"""The primary config (config.yaml) and its groups."""


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (`Umask:` in /proc/self/status).

    Elsewhere it is set and restored under a lock: `os.umask` has no read-only form, and between the two
    calls a file created by another thread would get mode 0666; the lock keeps this module's own writers
    out of that window (a thread creating files by other means could still fall into it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        umask = os.umask(0o077)
        os.umask(umask)
    return umask


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON so that readers see the old file or the whole new one, never a part.

    The file gets the mode `open` would give it (0666 less the umask), not mkstemp's 0600: a team sharing a
    store on one file system reads each other's records."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_new(path: str | os.PathLike) -> BinaryIO:
    """`path` opened to write from empty, never through a symbolic link (one planted in a shared store would make
    the write land in the file it points to): OSError (ELOOP) instead."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return os.fdopen(fd, "wb")


def read_json(path: str | os.PathLike) -> Optional[Any]:
    """The JSON in `path`, or None when it is missing or not (yet) whole JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
