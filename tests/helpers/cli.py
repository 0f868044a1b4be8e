"""The `scaling` command as a user runs it: a fresh interpreter, no standard input, output captured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

from tests.helpers.compose import REPO


def scaling(
    *args: str, cwd: Path = REPO, env: Optional[Mapping[str, str]] = None, timeout: float = 400, **kw: Any
) -> subprocess.CompletedProcess:
    """`python -m scaling ARGS` in `cwd` (the repository unless told), its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "scaling", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        **kw,
    )
