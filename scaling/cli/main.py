"""The `scaling` command: dispatch to each subcommand (run, sweep, plan, recipe, predict, find-mbs, report, status,
collectives); `python -m scaling` is the same command. The table of commands: README.md.

Exit status: 0, or 1 when a point failed or timed out (after every point ran), when a point was not run, or when
the store refused a write (its disk full, or read-only), 2 for a bad command line; a command line naming no command
prints the usage and exits 0. Shell completion (bash): eval "$(scaling run -sc install=bash)".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from scaling.cli.arg_types import parse_count

PROG = "scaling"
"""The command's name: Hydra's parser shows it in its usage line, and the lines handed to Hydra's completion
start with it."""


def run_app(argv: Sequence[str], config: Sequence[str] = ()) -> None:
    """Run the Hydra app of scaling.job.run on `argv` (after `config`, e.g. --config-name) as its `@hydra.main`
    would on the command line, without reading or rewriting sys.argv; raise `PointsFailed` when a point failed
    or timed out."""
    from scaling.core.schema import CONF_DIR, ConfigRefused, searchpath_override
    from scaling.job import run
    from scaling.launch.resolvers import register
    from scaling.sweep import progress
    from scaling.sweep.compose import refusal_line
    from scaling.sweep.hydra_adapter import composition_refused, get_args_parser, run_hydra

    register()
    parser = get_args_parser()
    parser.prog = PROG
    args = parser.parse_args([*config, *argv])
    if not any(o.lstrip("+").startswith("hydra.searchpath") for o in args.overrides):
        args.overrides.insert(0, searchpath_override())  # the project's own conf/ beside the shipped configs
    if args.experimental_rerun is not None:
        parser.error(
            "--experimental-rerun is not supported: run the point again with its overrides and launch.rerun=all"
        )
    with tempfile.TemporaryDirectory(prefix="scaling-outcome-") as tmp:
        outcome = Path(tmp) / "outcome.json"
        if not (args.help or args.hydra_help or args.cfg or args.info or args.shell_completion):
            # Where the progress callback leaves the counts; not added where Hydra only prints or completes.
            args.overrides.append(f"hydra.callbacks.progress.outcome_file={outcome}")
        # What run.main's @hydra.main does with the parsed command line (its config path and name).
        with composition_refused(lambda e: ConfigRefused(refusal_line(e))):
            run_hydra(
                args=args, args_parser=parser, task_function=run.main, config_path=str(CONF_DIR), config_name="config"
            )
        progress.raise_for_failures(progress.read_outcome(outcome))


def _run(argv: list[str]) -> int:
    run_app(argv)
    return 0


def _plan(argv: list[str]) -> int:
    from scaling.core.batch import BatchError, plan

    p = argparse.ArgumentParser(
        prog="scaling plan", description="Derive grad_acc from a target global batch (Playbook recipe)."
    )
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
    "run": (_run, "run one experiment point (Hydra overrides)"),
    "sweep": (_lazy("scaling.cli.sweep"), "run a named sweep from sweeps/ (Hydra multirun)"),
    "plan": (_plan, "grad_acc and effective global batch for a target gbs"),
    "recipe": (
        _lazy("scaling.cli.recipe"),
        "the batch-size recipe end to end: what to run on each GPU count, measured or extrapolated",
    ),
    "predict": (_lazy("scaling.cli.predict"), "peak memory per rank of a point or a sweep grid, before launch"),
    "find-mbs": (_lazy("scaling.cli.find_mbs"), "the largest mbs that fits, predicted and confirmed by two runs"),
    "report": (_lazy("scaling.cli.report"), "Markdown + HTML report of a sweep directory"),
    "status": (_lazy("scaling.cli.status"), "where a sweep stands: done, running, to run, time left"),
    "collectives": (
        _lazy("scaling.cli.collectives"),
        "measure the network's α-β figures per tier into a sweep directory",
    ),
}


def completion_target(line: str) -> tuple[Optional[list[str]], list[str], str]:
    """What completes a `scaling ...` command line: (words to offer, or None for Hydra; the config
    arguments of the app to ask; the line as that app sees it, `scaling <overrides>`)."""
    from scaling.sweep.named import available, find_sweep

    words = line.split()
    ended = line.endswith(" ")  # the cursor is on a new, empty word
    if len(words) < 2 or (len(words) == 2 and not ended):
        return list(COMMANDS), [], line
    config: list[str] = []
    rest = words[2:]
    if words[1] == "sweep":
        if len(words) == 2 or (len(words) == 3 and not ended):
            return available(), [], line
        path = find_sweep(words[2])
        config, rest = ["--config-dir", str(path.parent), "--config-name", path.stem], words[3:]
    elif words[1] != "run":
        return [], [], line
    return None, config, " ".join([PROG, *rest]) + (" " if ended else "")


def _complete(line: str) -> int:
    """Answer bash completion (`scaling -sc query=bash` with COMP_LINE): commands, sweeps, overrides."""
    offer, config, app_line = completion_target(line)
    if offer is not None:
        print(" ".join(offer))
        return 0
    os.environ["COMP_LINE"] = app_line  # Hydra completes the overrides of this line
    run_app(["-sc", "query=bash"], config)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Dispatch `scaling <command> ...`; turn the library's exceptions into exit statuses."""
    from scaling.core.files import StoreUnwritable
    from scaling.core.schema import ConfigRefused
    from scaling.store.read import NewerRecord
    from scaling.sweep.named import SweepNotFound
    from scaling.sweep.progress import PointsFailed

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-sc"], ["--shell-completion"]) and argv[1:] == ["query=bash"]:
        return _complete(os.environ.get("COMP_LINE", PROG))
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}: choose one of {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        return 0
    handler, _ = COMMANDS[argv[0]]
    try:
        return handler(argv[1:]) or 0
    except (PointsFailed, StoreUnwritable) as e:
        print(f"scaling {argv[0]}: {e}", file=sys.stderr)
        return 1
    except (SweepNotFound, NewerRecord, ConfigRefused) as e:
        print(f"scaling {argv[0]}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
