"""`scaling report SWEEP_DIR... [--out DIR] [--wandb]`: each sweep's Markdown + HTML report (analysis.report_writer),
led by the directory's recipe (scaling.recipe.render); several directories in one process, which imports the analysis
once (`make demo`: the sweep's and the recipe's)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from analysis.report_writer import write_report
from scaling.perf.knee import DEFAULT_THRESHOLD
from scaling.recipe.render import report_section


def main(argv: Optional[list[str]] = None) -> int:
    """`scaling report SWEEP_DIR... [--out DIR] [--wandb]`: write each report and print where it is; 1 if one could not
    be written (the others still are)."""
    p = argparse.ArgumentParser(prog="scaling report", description="Write each sweep's report (Markdown + HTML).")
    p.add_argument("sweep_dir", nargs="+", help="folders holding <job_key>/result.json records")
    p.add_argument("--out", default=None, help="output folder (default: SWEEP_DIR/report; one SWEEP_DIR only)")
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="DP efficiency below which scaling stops paying off (default 0.8)",
    )
    p.add_argument(
        "--wandb",
        action="store_true",
        help="also log a report run to W&B (job_type report) in SWEEP_DIR/wandb, beside the points' runs",
    )
    # W&B's own environment variables give the defaults; an option on the command line wins over them.
    p.add_argument(
        "--wandb-project",
        default=os.environ.get("WANDB_PROJECT", "scaling"),
        help="default: $WANDB_PROJECT, else scaling",
    )
    p.add_argument("--wandb-entity", default=os.environ.get("WANDB_ENTITY"), help="default: $WANDB_ENTITY")
    p.add_argument(
        "--wandb-mode",
        choices=("offline", "online", "disabled"),
        default=os.environ.get("WANDB_MODE", "offline"),
        help="default: $WANDB_MODE, else offline",
    )
    p.add_argument("--jobs", type=int, default=None, help="processes drawing the heatmaps (default: one per core)")
    args = p.parse_args(argv)
    for sweep_dir in args.sweep_dir:
        if not Path(sweep_dir).is_dir():
            p.error(f"SWEEP_DIR={sweep_dir!r} is not a directory: pass a sweep folder such as runs/demo")
    if args.out is not None and len(args.sweep_dir) > 1:
        p.error(
            f"--out={args.out!r} with {len(args.sweep_dir)} sweep folders: --out names one report's folder; "
            "give one SWEEP_DIR, or leave --out out (each report goes into its SWEEP_DIR/report)"
        )
    if not 0 < args.threshold <= 1:
        p.error(f"--threshold={args.threshold}: an efficiency threshold lies in (0, 1]")
    if args.jobs is not None and args.jobs < 1:
        p.error(f"--jobs={args.jobs}: at least one process draws the heatmaps")
    return max(_report(sweep_dir, args) for sweep_dir in args.sweep_dir)


def _report(sweep_dir: str, args: argparse.Namespace) -> int:
    """Write `sweep_dir`'s report as `args` say, print where it is; 1 (said on stderr) if it cannot be written."""
    out = Path(args.out) if args.out is not None else Path(sweep_dir) / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)  # before the records are read: a read-only store is said at once
        recipe = report_section(sweep_dir)  # the directory's `scaling recipe` answer leads
        paths = write_report(
            sweep_dir,
            out,
            args.threshold,
            args.wandb,
            args.wandb_project,
            args.wandb_mode,
            args.jobs,
            args.wandb_entity,
            [recipe] if recipe is not None else [],
        )
    except OSError as e:
        elsewhere = (
            "" if args.out else ": the report goes into SWEEP_DIR unless told; pass --out DIR to write it elsewhere"
        )
        print(f"scaling report: cannot write {e.filename or out} ({e.strerror or e}){elsewhere}", file=sys.stderr)
        return 1
    print(f"report: {paths['html']}")
    print(f"markdown: {paths['markdown']}")
    if "wandb_run_dir" in paths:
        print(f"wandb run: {paths['wandb_run_dir']}")
    return 0
