"""`scaling sweep NAME [--dry-run] [overrides]`: a named Hydra multirun from sweeps/NAME.yaml.

A thin wrapper: it is `python -m scaling.run --config-dir sweeps --config-name NAME [overrides]`
(the sweep file sets hydra.mode=MULTIRUN and lists its grid under hydra.sweeper.params), with the
exit status of `scaling run -m`: 0 when every point ended ok, oom, predicted_oom or invalid, 1 when
some point failed or timed out (every point is still run and recorded). `scaling sweep --help`
lists the sweeps with the first comment line of each file. `--dry-run` is `hydra.sweeper.dry_run=true`:
the grid's size, new, recorded, predicted_oom and invalid points and an estimate of the wall time,
with nothing launched.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

REPO_SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


class SweepNotFound(LookupError):
    """No sweep file of that name in ./sweeps or the project's sweeps/."""


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
    raise SweepNotFound(f"no sweep named {name!r}: choose one of {', '.join(available()) or '(none)'}")


def describe(path: Path) -> str:
    """What a sweep does: the first comment line of its file."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def usage() -> str:
    """`scaling sweep --help`: the command line and every sweep with what it does."""
    names = available()
    width = max(map(len, names), default=0)
    lines = ["usage: scaling sweep NAME [--dry-run] [overrides]   (a Hydra multirun of sweeps/NAME.yaml)", "",
             "--dry-run: the grid's size, new, recorded, predicted_oom and invalid points and the wall time it "
             "would take, launching nothing", "", "sweeps:"]
    lines += [f"  {name:<{width}}  {describe(find_sweep(name))}" for name in names]
    lines += ["", "scaling sweep NAME --help shows the sweep's config and Hydra's options."]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the named sweep; raises PointsFailed when a point failed or timed out."""
    from scaling.cli import run_app

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    path = find_sweep(argv[0])
    overrides = ["hydra.sweeper.dry_run=true" if a == "--dry-run" else a for a in argv[1:]]
    run_app(overrides, ["--config-dir", str(path.parent), "--config-name", path.stem])
    return 0
