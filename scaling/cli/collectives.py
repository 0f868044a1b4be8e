"""`scaling collectives [--sweep-dir DIR] [overrides]`: measure the network and write the sweep's α-β profile."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

from scaling.launch.network_probe import measure_and_save, plan_launches
from scaling.perf.network import CPU_SIZES, CUDA_SIZES
from scaling.perf.network_figures import PROFILE_FILE, describe


def main(argv: Optional[list[str]] = None) -> int:
    """`scaling collectives [--sweep-dir DIR] [overrides]`: measure the network and write the sweep's profile."""
    from scaling.cli.arg_types import parse_count

    p = argparse.ArgumentParser(
        prog="scaling collectives",
        description=(
            "Time all-reduce, reduce-scatter and all-gather through the launchers of a point (torchrun here; srun + "
            "torchrun across nodes under SLURM) at 2, 4, ... up to parallel.dp ranks, fit α and β per network tier "
            f"and write SWEEP_DIR/{PROFILE_FILE} for `scaling report`."
        ),
    )
    p.add_argument("--sweep-dir", default=None, help="where the profile goes (default: the config's sweep_dir)")
    p.add_argument(
        "--sizes",
        default=None,
        help="message sizes, comma-separated, e.g. 4Ki,1Mi,16Mi (default: 4 KiB to 16 MiB on CPU, to 256 MiB on CUDA)",
    )
    p.add_argument("--iters", type=int, default=10, help="timed calls per collective and size (default 10)")
    p.add_argument("--dry-run", action="store_true", help="print the launches it would make and launch nothing")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of `scaling run`, e.g. hardware=h100 parallel.dp=16")
    a = p.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if a.iters < 2:
        p.error(f"--iters={a.iters}: at least 2 timed calls, so the profile has a spread")
    try:
        sizes = [parse_count(s) for s in a.sizes.split(",")] if a.sizes else None
    except argparse.ArgumentTypeError as e:
        p.error(f"--sizes={a.sizes!r}: {e}")
    from scaling.sweep.compose import ComposeError, compose_config

    try:
        cfg = compose_config(a.overrides)
    except ComposeError as e:
        p.error(str(e))
    if cfg.parallel.dp < 1:
        p.error(f"parallel.dp={cfg.parallel.dp} is the largest launch's ranks: give dp >= 1 (1 and 2 both measure 2)")
    sweep_dir = Path(a.sweep_dir or cfg.sweep_dir).resolve()
    sizes = sizes or list(CUDA_SIZES if cfg.hardware.device == "cuda" else CPU_SIZES)
    try:
        if a.dry_run:
            launches = plan_launches(cfg, sweep_dir, sizes, a.iters, os.environ)
            print(f"Dry run: {len(launches)} launch(es), nothing launched")
            for n, (_, argv) in launches.items():
                print(f"  n={n}: {shlex.join(argv)}")
            return 0
        profile, path, kept = measure_and_save(cfg, sweep_dir, sizes, a.iters)
    except ValueError as e:
        print(f"scaling collectives: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"scaling collectives: {e}", file=sys.stderr)
        return 1
    print(f"{profile.name}:")
    for line in describe(profile):
        print(f"  {line}")
    print(f"profile: {path}" + (f" (the earlier one kept as {kept.name})" if kept else ""))
    return 0
