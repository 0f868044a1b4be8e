"""The `scaling` command: run a point, run a named sweep, plan a batch, predict memory, report.

    scaling run [overrides]              one point (= python -m scaling.run)
    scaling sweep NAME [overrides]       a named multirun from sweeps/NAME.yaml
    scaling plan --gbs-tokens 4M --seq-len 4000 --mbs 2 --gpus 128
    scaling predict [overrides]          memory breakdown before launch
    scaling find-mbs [overrides]         the largest mbs that fits
    scaling report SWEEP_DIR             Markdown + HTML report with heatmaps
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Callable, Optional

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_count(text: str) -> int:
    """'4M' -> 4_000_000, '4Mi' -> 4_194_304, '2048' -> 2048 (decimal and binary suffixes)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]i?)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: use e.g. 4096, 4M (10^6) or 4Mi (2^20)")
    value = float(match.group(1)) * _SUFFIXES[(match.group(2) or "").lower()]
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole count")
    return int(value)


def _hydra(argv: list[str]) -> int:
    """Hand the arguments to the Hydra app of scaling.run, as `python -m scaling.run` would get them."""
    from scaling import run

    sys.argv = ["scaling.run", *argv]
    run.main()
    return 0


def _plan(argv: list[str]) -> int:
    from scaling.batch import BatchError, plan

    p = argparse.ArgumentParser(prog="scaling plan", description="Derive grad_acc from a target global batch (Playbook recipe).")
    p.add_argument("--gbs-tokens", type=parse_count, required=True, help="target global batch in tokens, e.g. 4M")
    p.add_argument("--seq-len", type=parse_count, required=True)
    p.add_argument("--mbs", type=parse_count, required=True, help="micro-batch size (largest that fits)")
    p.add_argument("--gpus", type=parse_count, required=True, help="data-parallel GPUs available")
    a = p.parse_args(argv)
    try:
        print(plan(a.gbs_tokens, a.seq_len, a.mbs, a.gpus).describe())
    except BatchError as e:
        p.error(str(e))
    return 0


def _lazy(module: str) -> Callable[[list[str]], Optional[int]]:
    """A subcommand implemented by `module.main(argv)`, imported only when used."""
    def call(argv: list[str]) -> Optional[int]:
        import importlib

        return importlib.import_module(module).main(argv)
    return call


COMMANDS: dict[str, tuple[Callable[[list[str]], Optional[int]], str]] = {
    "run": (_hydra, "run one experiment point (Hydra overrides)"),
    "sweep": (_lazy("scaling.sweep"), "run a named sweep from sweeps/ (Hydra multirun)"),
    "plan": (_plan, "grad_acc and effective global batch for a target gbs"),
    "predict": (_lazy("scaling.predictor.cli"), "peak memory per rank of a point or a sweep grid, before launch"),
    "find-mbs": (_lazy("scaling.predictor.find_mbs"), "the largest mbs that fits, predicted and confirmed by two runs"),
    "report": (_lazy("analysis.report"), "Markdown + HTML report of a sweep directory"),
}


def main(argv: Optional[list[str]] = None) -> int:
    """Dispatch `scaling <command> ...`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}: choose one of {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        return 0
    handler, _ = COMMANDS[argv[0]]
    return handler(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
