"""Files every process writes and reads the same way: JSON and text written atomically under the user's umask (a
failed write names its path), and read back as None while missing or not yet whole; space set aside for a file
before the work it records (`Reservation`); logs opened without following links; a store that refuses writes
(`StoreUnwritable`: its disk full, or read-only); where the shipped data packages (configs, sweeps) are. Standard
library only (the ranks use it too)."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

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


OWN_CONF = "conf"
"""A project's own config groups: `./conf/<group>/<name>.yaml` in the working directory (a model preset, a hardware
profile, network figures), found on top of the shipped ones."""


def config_dirs() -> list[Path]:
    """Where config groups are looked up, first match first: the working directory's conf/ (when it has one and it is
    not the shipped one, as in the repository itself), then the shipped configs."""
    own = (Path.cwd() / OWN_CONF).resolve()
    return ([own] if own.is_dir() and own != CONF_DIR.resolve() else []) + [CONF_DIR]


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
    """Write JSON so that readers see the old file or the whole new one, never a part (`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str))


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write text so that readers see the old file or the whole new one, never a part; an OSError names `path`.

    The file gets the mode `open` would give it (0666 less the umask), not mkstemp's 0600: a team sharing a
    store on one file system reads each other's records."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


class Reservation:
    """Space set aside for a file before the work it records, so that the work is never lost to a full disk: the
    block holds a hidden file of `size` bytes beside `path` (SIGKILL leaves it, as it leaves a temp file), and
    `write_json` writes into it in place, whole, and renames it to `path`; leaving the block gives back what was not
    written. An OSError names `path`: setting the space aside fails where writing would."""

    def __init__(self, path: str | os.PathLike, size: int) -> None:
        self.path, self.size = Path(path), size
        self._fd: Optional[int] = None
        self._tmp: Optional[str] = None

    def __enter__(self) -> Reservation:
        try:
            self._fd, self._tmp = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".reserved", dir=self.path.parent
            )
            try:
                os.posix_fallocate(self._fd, 0, self.size)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system that cannot: written instead
                    raise
                os.pwrite(self._fd, bytes(self.size), 0)
        except OSError as e:
            self.__exit__()
            raise OSError(e.errno, e.strerror, str(self.path)) from e
        return self

    def write_json(self, obj: Any) -> None:
        """Write `obj` as `write_json_atomic` would, into the space set aside (more, if it is larger, as any write)."""
        assert self._fd is not None and self._tmp is not None, "written once, inside its block"
        data = json.dumps(obj, indent=2, sort_keys=False, default=str).encode()
        try:
            os.fchmod(self._fd, 0o666 & ~current_umask())
            done = 0
            while done < len(data):
                done += os.pwrite(self._fd, data[done:], done)
            os.ftruncate(self._fd, len(data))
            os.fsync(self._fd)
            os.replace(self._tmp, self.path)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(self.path)) from e
        self._tmp = None

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tmp is not None:
            Path(self._tmp).unlink(missing_ok=True)
            self._tmp = None


NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""A write refused for want of space: the disk (or the user's quota) is full."""
READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
"""A write refused because the place is read-only, or another user's."""


class StoreUnwritable(BaseException):
    """The store refused a write: its disk is full, or it is read-only. The run stops at once and says where and
    why in one line (`scaling` exits 1), nothing recorded lost. A BaseException, as KeyboardInterrupt is: Hydra takes
    a job's Exception for that job's failure and goes on with the next, which would fail the same way."""

    def __init__(self, message: str, no_space: bool) -> None:
        super().__init__(message)
        self.no_space = no_space
        """The disk is full (else the store is read-only)."""


def unwritable(e: OSError, path: str | os.PathLike) -> Optional[StoreUnwritable]:
    """The stop a failed write of `path` calls for, its message naming the path and the space left; None for an
    error that is not the store's refusal."""
    path = e.filename or path
    if e.errno in NO_SPACE:
        return StoreUnwritable(
            f"no space left writing {path} ({space_left(path)}): stopped; what is recorded is kept, and the same "
            "command run again once there is space picks up from here",
            no_space=True,
        )
    if e.errno in READ_ONLY:
        return StoreUnwritable(f"cannot write {path} ({e.strerror}): the store is read-only here", no_space=False)
    return None


def short_of_space(path: str | os.PathLike, error: Optional[str], below: int) -> bool:
    """Whether work that failed in `path` with `error` (its last line) failed for want of space: the error says so,
    or less than `below` bytes are free there."""
    said = any(words in (error or "") for words in ("No space left on device", "Disk quota exceeded"))
    return said or shutil.disk_usage(path).free < below


@contextlib.contextmanager
def stop_when_unwritable(path: str | os.PathLike) -> Iterator[None]:
    """Inside the block, a write the store refuses (no space, read-only) stops the run (`unwritable`; `path` named
    when the error names none); any other OSError passes as it is."""
    try:
        yield
    except OSError as e:
        stop = unwritable(e, path)
        if stop is None:
            raise
        raise stop from e


def space_left(path: str | os.PathLike) -> str:
    """`52 KiB free of 300 KiB on /mnt/store`: the free space of the file system that holds `path`."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    mount = where
    while not os.path.ismount(mount):
        mount = mount.parent
    usage = shutil.disk_usage(where)
    return f"{_size(usage.free)} free of {_size(usage.total)} on {mount}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n // 1024} KiB"


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
