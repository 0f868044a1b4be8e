"""`scaling sweep NAME [--dry-run] [overrides]`: a named Hydra multirun (see scaling.sweep.named)."""

from __future__ import annotations

import sys
from typing import Optional

from scaling.sweep.named import available, describe, find_sweep


def usage() -> str:
    """`scaling sweep --help`: the command line and every sweep with what it does."""
    names = available()
    width = max(map(len, names), default=0)
    lines = [
        "usage: scaling sweep NAME [--dry-run] [overrides]   (a Hydra multirun of sweeps/NAME.yaml)",
        "",
        "--dry-run: the grid's size, new, recorded, predicted_oom and invalid points and the wall time it "
        "would take, launching nothing",
        "",
        "sweeps:",
    ]
    lines += [f"  {name:<{width}}  {describe(find_sweep(name))}" for name in names]
    lines += ["", "scaling sweep NAME --help shows the sweep's config and Hydra's options."]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the named sweep; raises PointsFailed when a point failed or timed out."""
    from scaling.cli.main import run_app

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    path = find_sweep(argv[0])
    overrides = ["hydra.sweeper.dry_run=true" if a == "--dry-run" else a for a in argv[1:]]
    # a multirun whatever the file says (one without hydra.mode=MULTIRUN ran its first point and ignored --dry-run)
    run_app(overrides, ["--config-dir", str(path.parent), "--config-name", path.stem, "--multirun"])
    return 0
