"""`scaling sweep NAME [--dry-run] [overrides]`: a named Hydra multirun from sweeps/NAME.yaml.

A thin wrapper: it is `python -m scaling run --config-dir sweeps --config-name NAME --multirun [overrides]`
(the sweep file lists its grid under hydra.sweeper.params; its hydra.mode, if it sets one, is MULTIRUN), with the
exit status of `scaling run -m`: 0 when every point ended ok, oom, predicted_oom or invalid, 1 when
some point failed or timed out (every point is still run and recorded). `scaling sweep --help`
lists the sweeps with the first comment line of each file. `--dry-run` is `hydra.sweeper.dry_run=true`:
the grid's size, new, recorded, predicted_oom and invalid points and an estimate of the wall time,
with nothing launched.
"""

from __future__ import annotations

from pathlib import Path

from scaling.core.files import package_dir

SHIPPED_SWEEPS = package_dir("scaling.sweeps")
"""The sweeps that ship with the project (the repository's sweeps/, installed as scaling.sweeps)."""


class SweepNotFound(LookupError):
    """No sweep file of that name in ./sweeps or the project's sweeps/."""


def sweep_dirs() -> list[Path]:
    """Where sweep files are looked up: ./sweeps first, then the project's own sweeps/."""
    dirs = [Path.cwd() / "sweeps", SHIPPED_SWEEPS]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d.resolve() not in [x.resolve() for x in dirs[:i]]]


def available() -> list[str]:
    """Names of the sweeps that can be run."""
    return sorted({p.stem for d in sweep_dirs() for p in d.glob("*.yaml")})


def find_sweep(name: str) -> Path:
    """The sweep file of `name` (./sweeps first, then the shipped ones), or the file `name` names when it is a path
    (it ends in .yaml or .yml, or has a /); a clear error listing the valid names otherwise."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise SweepNotFound(
                f"no sweep file {name!r} (from {Path.cwd()}): give a path to a sweep file or a name, one of "
                f"{', '.join(available()) or '(none)'}"
            )
        return path.resolve()
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
