"""Process lifetime: a child that must not outlive the parent that started it.

The driver starts torchrun, torchrun the ranks; each child asks Linux to SIGKILL it when its parent dies
(PR_SET_PDEATHSIG) and then checks that its parent is still the one that started it (a parent that died before the
request has already handed the child to init). Ranks do it before `import torch` (or, forked from their agent with
torch in memory, first thing: `forked_from_agent`). Also the tests' gate at each named
start-up phase of a rank (`gate`, `SCALING_TEST_GATE`): a test reaches a state instead of sleeping until it
probably holds. Standard library only: the worker calls it before it imports anything else.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
TORCHRUN_MARKERS = ("scaling.engine.agent", "torch.distributed.run", "torchrun")
"""How a rank recognises its torchrun agent in the parent's command line (ours: scaling/engine/agent.py)."""
GATE_ENV = "SCALING_TEST_GATE"
"""Tests only: a directory; with it set, every rank stops at each phase of `GATE_PHASES` (see `gate`)."""
GATE_PHASES = ("rank_started", "before_torch", "torch_imported", "process_group", "model_built", "first_step")
"""A rank's start-up in order: started (before its death signal is requested), death signal requested
(before `import torch`), torch imported, process group up, model built, about to run its first step."""


def _request_death_signal() -> bool:
    """PR_SET_PDEATHSIG with SIGKILL; False where Linux's prctl is not there."""
    if not sys.platform.startswith("linux"):
        return False
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return True


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies; exit at once if `parent_pid` is no longer its parent.

    Meant for `subprocess.Popen(preexec_fn=...)`: the driver passes its own pid, read before the fork.
    """
    if _request_death_signal() and os.getppid() != parent_pid:
        os._exit(1)


def parent_command(pid: int) -> str:
    """The command line of process `pid` as one string ('' when it cannot be read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def die_with_torchrun() -> None:
    """For a rank: SIGKILL with its torchrun agent; exit at once if the agent is already gone.

    The agent passes no pid to its ranks, so the rank checks what its parent is: a torchrun
    agent's command line, not init's or a subreaper's.
    """
    if _request_death_signal() and not any(m in parent_command(os.getppid()) for m in TORCHRUN_MARKERS):
        os._exit(1)


def forked_by_agent() -> bool:
    """Whether this rank was forked by its torchrun agent (scaling/engine/agent.py) rather than started fresh."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def forked_from_agent() -> None:
    """For a rank its torchrun agent forked from itself (`forked_by_agent`), nothing otherwise: the signal
    dispositions of a fresh interpreter instead of the agent's handlers, which would turn the agent's SIGTERM into an
    exception the rank records as its own error. SIGTERM, SIGINT, SIGHUP and SIGQUIT end it by the signal, as they
    end a fresh rank, whose exit the agent reports as that signal."""
    if not forked_by_agent():
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def gate(phase: str) -> None:
    """Tests only: with SCALING_TEST_GATE=<dir>, append this rank and pid to <dir>/<phase>.reached and wait
    until <dir>/<phase>.go exists; without it (every real run) return at once."""
    root = os.environ.get(GATE_ENV)
    if not root:
        return
    with open(Path(root, f"{phase}.reached"), "a") as f:  # one short line per rank: appends do not interleave
        f.write(f"{os.environ.get('RANK', '?')} {os.getpid()}\n")
    while not Path(root, f"{phase}.go").exists():
        time.sleep(0.01)
