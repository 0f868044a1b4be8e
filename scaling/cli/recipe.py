"""`scaling recipe`: the batch-size recipe end to end and what to run on each GPU count; its arguments parsed and
checked before anything runs, handed to scaling.recipe.end_to_end, its answer printed and written
(scaling.recipe.render: DIR/recipe.md and DIR/recipe.json).

    scaling recipe [overrides] --gbs-tokens 4M --gpus 8,32,128,512 [--tokens 1T] [--sweep-dir DIR] [--json]

The steps, what is measured and what is extrapolated or predicted: docs/recipe.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from scaling.cli.arg_types import parse_count
from scaling.core.enums import Recompute, ZeroStage
from scaling.core.schema import ExperimentConfig, TrainConfig
from scaling.recipe.request import RecipeError, RecipeRequest, check

DEFAULT_DIR = "runs/recipe"


def _counts(text: str) -> list[int]:
    """'8,32,128' -> [8, 32, 128] (each a positive count; 4k style suffixes allowed)."""
    return [parse_count(part) for part in text.split(",") if part.strip()]


def _choices(text: str, valid: tuple, cast: type) -> list:
    values = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            value = cast(part)
        except ValueError:
            value = None
        if value not in valid:
            raise argparse.ArgumentTypeError(f"{part!r} is not one of {', '.join(map(str, valid))}")
        values.append(value)
    return values


def parser() -> argparse.ArgumentParser:
    """The command line of `scaling recipe`."""
    p = argparse.ArgumentParser(prog="scaling recipe", description=__doc__.split("\n\n")[0])
    p.add_argument("--gbs-tokens", type=parse_count, required=True, help="target global batch in tokens, e.g. 4M")
    p.add_argument("--gpus", type=_counts, required=True, help="GPU counts to answer for, e.g. 8,32,128,512")
    p.add_argument("--tokens", type=parse_count, default=None, help="tokens to train on, e.g. 1T (time, GPU-hours)")
    p.add_argument(
        "--sweep-dir",
        default=None,
        help=f"where the records and the recipe go, as the override sweep_dir=DIR says (default {DEFAULT_DIR})",
    )
    p.add_argument("--json", action="store_true", help="print recipe.json instead of the table")
    p.add_argument(
        "--dry-run", action="store_true", help="check the request (batch, config, capacity) and launch nothing"
    )
    default = RecipeRequest.default
    stages, settings = tuple(int(z) for z in ZeroStage), tuple(str(r) for r in Recompute)
    p.add_argument(
        "--zero",
        type=lambda t: _choices(t, stages, int),
        default=default("zero"),
        help=f"ZeRO stages (default {','.join(map(str, default('zero')))})",
    )
    p.add_argument(
        "--recompute",
        type=lambda t: _choices(t, settings, str),
        default=default("recompute"),
        help=f"train.recompute settings (default {','.join(default('recompute'))})",
    )
    p.add_argument(
        "--pp",
        type=_counts,
        default=default("pp"),
        help="pipeline stages to weigh, e.g. 2,4,8 (default: 2, 4, 8, 16 where nothing else fits or the batch runs "
        "out of samples for dp)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=default("threshold"),
        help=f"efficiency below which DP stops paying off ({default('threshold')})",
    )
    p.add_argument(
        "--max-grad-acc",
        type=int,
        default=default("max_grad_acc"),
        help="a measured point runs at most this many micro-steps (a larger grad_acc is extrapolated; default "
        f"{default('max_grad_acc')})",
    )
    p.add_argument(
        "--draws", type=int, default=default("draws"), help=f"bootstrap draws of each band (default {default('draws')})"
    )
    p.add_argument(
        "--assume-mfu",
        type=float,
        default=None,
        help="MFU to plan with where nothing is measured on the hardware, e.g. 0.4 (default: conf/mfu/<hardware>.yaml)",
    )
    p.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. model=small train.seq_len=256 hardware.memory_gb=0.05"
    )
    return p


def _refuse(message: str) -> int:
    print(f"scaling recipe: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[list[str]] = None) -> int:
    """`scaling recipe`: measure what the sweep directory lacks, then print and write the recipe."""
    p = parser()
    a = p.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if not 0 < a.threshold < 1:
        p.error(f"--threshold={a.threshold} must lie between 0 and 1, e.g. 0.8")
    if a.max_grad_acc < 1:
        p.error(f"--max-grad-acc={a.max_grad_acc} must be >= 1")
    if a.draws < 10:
        p.error(f"--draws={a.draws} must be >= 10")
    if a.assume_mfu is not None and not 0 < a.assume_mfu <= 1:
        p.error(f"--assume-mfu={a.assume_mfu} must lie in (0, 1], a fraction of the peak, e.g. 0.4")
    # `sweep_dir=DIR` among the overrides, as `scaling run` and `sweep` take it, is the directory too
    named = [o.split("=", 1)[1] for o in a.overrides if o.startswith("sweep_dir=")]
    if named and a.sweep_dir is not None and Path(named[-1]) != Path(a.sweep_dir):
        return _refuse(f"sweep_dir={named[-1]} and --sweep-dir {a.sweep_dir} name two directories: give one of them")
    sweep_dir = Path(a.sweep_dir or (named[-1] if named else DEFAULT_DIR))
    overrides = [o for o in a.overrides if not o.startswith(("sweep_dir=", "sweep="))]
    cfg = _compose(overrides, sweep_dir)
    if isinstance(cfg, str):
        return _refuse(cfg)
    request = RecipeRequest(
        a.gbs_tokens, a.gpus, a.zero, a.recompute, a.threshold, a.tokens, a.max_grad_acc, a.draws, a.assume_mfu, a.pp
    )
    try:
        gbs_samples = check(cfg, request)
    except RecipeError as e:
        return _refuse(str(e))
    if (refusal := _default_seq_len(cfg, overrides)) is not None:
        return _refuse(refusal)
    if a.dry_run:
        seq_len = cfg.train.seq_len
        print(
            f"scaling recipe: {cfg.model.name} at seq_len {seq_len} on {cfg.hardware.name}, a global batch "
            f"of {gbs_samples:,} sequences ({gbs_samples * seq_len:,} tokens"
            + (f", the nearest to --gbs-tokens {a.gbs_tokens:,}" if gbs_samples * seq_len != a.gbs_tokens else "")
            + f"), GPU counts {', '.join(map(str, a.gpus))}, ZeRO {', '.join(map(str, a.zero))}, recompute "
            f"{', '.join(a.recompute)}, records in {sweep_dir}: valid; --dry-run, nothing launched"
        )
        return 0
    from scaling.recipe.end_to_end import run_recipe
    from scaling.recipe.render import dumps, terminal, write

    recipe = run_recipe(cfg, overrides, sweep_dir, request)
    written = write(recipe, sweep_dir)
    print(dumps(recipe) if a.json else terminal(recipe) + f"\n\nwritten: {', '.join(map(str, written))}")
    return 0


def _default_seq_len(cfg: ExperimentConfig, overrides: list[str]) -> Optional[str]:
    """Why a GPU plan is refused when its sequence length is the default one (sized for a CPU demo) that nothing
    asked for: the CPU default never reaches a GPU plan silently."""
    given = any(o.lstrip("+").startswith("train.seq_len=") for o in overrides)
    if cfg.hardware.device != "cuda" or given or cfg.train.seq_len != TrainConfig.seq_len:
        return None
    return (
        f"train.seq_len is not given and its default, {cfg.train.seq_len}, is sized for a CPU demo: a "
        f"hardware={cfg.hardware.name} plan needs the length you train at: add train.seq_len=4096 (or your own; "
        f"train.seq_len={cfg.train.seq_len} to plan at {cfg.train.seq_len} after all)"
    )


def _compose(overrides: list[str], sweep_dir: Path) -> ExperimentConfig | str:
    """The base config (warm ranks unless the overrides say otherwise), or why it cannot be composed."""
    from scaling.sweep.compose import ComposeError, compose_config

    reuse = [] if any(o.startswith("launch.reuse=") for o in overrides) else ["launch.reuse=true"]
    try:
        return compose_config([*reuse, *overrides, "sweep=recipe", f"sweep_dir={sweep_dir}"])
    except ComposeError as e:
        return str(e)


if __name__ == "__main__":
    sys.exit(main())
