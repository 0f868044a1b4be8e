"""Which processes are still alive: the tests' check that no rank or torchrun outlives its job."""

from __future__ import annotations

import psutil


def processes_mentioning(marker: str) -> list[psutil.Process]:
    """Live processes with `marker` in their command line (a job key, a sweep directory)."""
    return [p for p in psutil.process_iter(["cmdline"]) if any(marker in part for part in p.info["cmdline"] or [])]
