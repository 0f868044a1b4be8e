"""torchrun's agent: `python -m scaling.engine.agent ARGS` is `torchrun ARGS` (torch.distributed.run's own `main`),
with torch imported while the cyclic garbage collector is off, and off CUDA its ranks forked from it (`FORK_ENV`).

The agent imports all of torch to start two ranks and watch them; a collector left on walks the modules being made
over and over while they load and finds next to nothing (a fifth of the import's CPU, paid again by every point a
fresh launch runs). What the imports made is frozen out of the collector's walk and the collector turned back on
before the agent starts, so from there it runs as torchrun does. scaling.launch.torchrun's `torchrun_argv` starts
points, warm jobs and the collectives benchmark through it; a rank knows it for its agent by its module name
(scaling.engine.lifetime.TORCHRUN_MARKERS).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import sys

FORK_ENV = "SCALING_FORK_RANKS"
"""1 (scaling.launch.torchrun.job_env sets it off CUDA unless it is set): `-m MODULE ARGS` becomes torchrun's own
`--start-method=fork --run-path <MODULE's file> ARGS`, after the agent imported MODULE and ran its `preload()` if it
has one (scaling.engine.worker's imports torch's compiler stack, which a rank's first optimizer step imports, the
wrappers and the memory trackers). A rank then starts with all of it in memory instead of importing it: about 2.8 s of
CPU a rank at every launch, paid once by the agent instead. On CUDA (or with 0) the ranks are fresh interpreters, as
torchrun starts them by default: what the agent's imports leave of CUDA's state in a forked child is not checked."""


def forked(argv: list[str]) -> tuple[list[str], str]:
    """torchrun's arguments `[..., '-m', MODULE, *ARGS]` with MODULE run from its file in ranks forked from this
    process, and MODULE's name."""
    at = argv.index("-m")
    module = argv[at + 1]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module named {module!r} to fork ranks of")
    return [*argv[:at], "--start-method=fork", "--run-path", spec.origin, *argv[at + 2 :]], module


if __name__ == "__main__":
    gc.disable()
    from torch.distributed.run import main

    args = sys.argv[1:]
    if os.environ.get(FORK_ENV) == "1" and "-m" in args:
        args, name = forked(args)
        preload = getattr(importlib.import_module(name), "preload", None)
        if preload is not None:
            preload()
    gc.freeze()
    gc.enable()
    sys.exit(main(args))
