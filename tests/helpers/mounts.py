"""Real mounts for the store's faults: a small tmpfs that fills up, a read-only bind mount. Mounting needs root (CI
runs as root): `ROOT_ONLY` says why a caller that is not skips."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator, Optional

ROOT_ONLY: Optional[str] = None if os.geteuid() == 0 else "mounting needs root (CI runs the tests as root)"


@contextlib.contextmanager
def tmpfs(at: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's `size=`: 1m, 200k) mounted at `at`, unmounted on the way out."""
    at.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(at)], check=True)
    try:
        yield at
    finally:
        subprocess.run(["umount", str(at)], check=True)


def resize(disk: Path, size: str) -> None:
    """Give the tmpfs at `disk` another size, its files kept."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


@contextlib.contextmanager
def read_only(source: Path, at: Path) -> Iterator[Path]:
    """`source` seen read-only at `at` (a bind mount, remounted read-only), unmounted on the way out."""
    at.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(at)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(at)], check=True)
        yield at
    finally:
        subprocess.run(["umount", str(at)], check=True)


def fill(disk: Path) -> Path:
    """A file that takes every byte left on `disk`."""
    ballast = disk / "ballast"
    with open(ballast, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(bytes(4096))
    return ballast
