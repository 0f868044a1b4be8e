"""torchrun's agent: `python -m scaling.engine.agent ARGS` is `torchrun ARGS` (torch.distributed.run's own `main`),
with torch imported while the cyclic garbage collector is off.

The agent imports all of torch to start two ranks and watch them; a collector left on walks the modules being made
over and over while they load and finds next to nothing (a fifth of the import's CPU, paid again by every point a
fresh launch runs). What the imports made is frozen out of the collector's walk and the collector turned back on
before the agent starts, so from there it runs as torchrun does. scaling.launch.torchrun's `torchrun_argv` starts
points, warm jobs and the collectives benchmark through it; a rank knows it for its agent by its module name
(scaling.engine.lifetime.TORCHRUN_MARKERS).
"""

from __future__ import annotations

import gc
import sys

if __name__ == "__main__":
    gc.disable()
    from torch.distributed.run import main

    gc.freeze()
    gc.enable()
    sys.exit(main())
