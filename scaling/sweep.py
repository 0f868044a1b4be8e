"""`scaling sweep NAME [overrides]`: a named Hydra multirun from sweeps/NAME.yaml.

A thin wrapper: it is `python -m scaling.run --config-dir sweeps --config-name NAME [overrides]`
(the sweep file sets hydra.mode=MULTIRUN and lists its grid under hydra.sweeper.params), plus an
exit status: 0 when every point ended ok, oom, predicted_oom or invalid, 1 when some point
failed or timed out (every point is still run and recorded).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

REPO_SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def sweep_dirs() -> list[Path]:
    """Where sweep files are looked up: ./sweeps first, then the project's own sweeps/."""
    dirs = [Path.cwd() / "sweeps", REPO_SWEEPS]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d.resolve() not in [x.resolve() for x in dirs[:i]]]


def available() -> list[str]:
    """Names of the sweeps that can be run."""
    return sorted({p.stem for d in sweep_dirs() for p in d.glob("*.yaml")})


def find_sweep(name: str) -> Path:
    """The sweep file of `name`; a clear error listing the valid names otherwise."""
    for d in sweep_dirs():
        if (d / f"{name}.yaml").is_file():
            return d / f"{name}.yaml"
    raise SystemExit(f"scaling sweep: no sweep named {name!r}: choose one of {', '.join(available()) or '(none)'}")


def main(argv: Optional[list[str]] = None) -> int:
    """Run the named sweep; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(f"usage: scaling sweep NAME [overrides]\nsweeps: {', '.join(available())}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    path = find_sweep(argv[0])
    from scaling import progress, run

    sys.argv = ["scaling.run", "--config-dir", str(path.parent), "--config-name", path.stem, *argv[1:]]
    run.main()
    counts = progress.last_counts
    return 1 if counts is not None and progress.has_failures(counts) else 0
