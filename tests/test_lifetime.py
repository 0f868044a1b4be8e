"""No rank outlives its sweep: the driver SIGKILLed at each phase of a point's start-up leaves nothing behind.

The ranks stop at each phase (scaling.engine.lifetime's test gate, SCALING_TEST_GATE), so every moment is a
state the test reaches before it kills, not a delay it hopes lands there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import psutil
import pytest

from scaling.engine.agent import FORK_ENV
from scaling.engine.lifetime import GATE_ENV, GATE_PHASES, parent_command
from tests.helpers.processes import processes_mentioning

REPO = Path(__file__).resolve().parents[1]
DP = 2
IMPORTING_TORCH = "importing_torch"
"""Not a gate: both ranks let through `before_torch` and neither at `torch_imported` yet. Only a fresh rank imports
torch (CUDA's start, here by FORK_ENV=0): on CPU the agent forks its ranks with torch in memory."""
MOMENTS = [*GATE_PHASES[:2], IMPORTING_TORCH, *GATE_PHASES[2:]]


def _reached(gates: Path, phase: str) -> int:
    """How many ranks have arrived at `phase`."""
    path = gates / f"{phase}.reached"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _release(gates: Path, phases: Sequence[str]) -> None:
    for phase in phases:
        (gates / f"{phase}.go").touch()


def _pids(gates: Path, phase: str) -> list[int]:
    """The ranks that have arrived at `phase`."""
    return [int(line.split()[1]) for line in (gates / f"{phase}.reached").read_text().splitlines()]


def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` handles `sig` itself (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return bool(int(next(line for line in status if line.startswith("SigCgt:")).split()[1], 16) >> (sig - 1) & 1)


def _left_after(sweep_dir: Path, settle_s: float = 10.0) -> list[str]:
    """Processes of the point still alive once the kernel has had `settle_s` to deliver the death signals."""
    deadline = time.monotonic() + settle_s
    while (left := processes_mentioning(str(sweep_dir))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [" ".join(p.info["cmdline"] or [])[:120] for p in left]


@pytest.mark.subprocess
@pytest.mark.own_agent_servers  # its moments include its own server's start
@pytest.mark.parametrize("moment", MOMENTS)
def test_killing_the_driver_at_any_phase_of_start_up_leaves_no_process(tmp_path, moment):
    sweep_dir, gates = tmp_path / "sweep", tmp_path / "gates"
    gates.mkdir()
    if moment == IMPORTING_TORCH:  # through `before_torch` without stopping, then into `import torch` (seconds)
        arrive, passed = "before_torch", GATE_PHASES[:2]
    else:
        arrive, passed = moment, GATE_PHASES[: GATE_PHASES.index(moment)]
    _release(gates, passed)
    driver = subprocess.Popen(  # many steps: a rank that survived would still be running when the test looks
        [
            sys.executable,
            "-m",
            "scaling",
            "run",
            "model=tiny",
            "train.seq_len=64",
            f"parallel.dp={DP}",
            "logger=none",
            "train.steps=200",
            f"sweep_dir={sweep_dir}",
        ],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, GATE_ENV: str(gates), **({FORK_ENV: "0"} if moment == IMPORTING_TORCH else {})},
    )
    try:
        deadline = time.monotonic() + 120
        while _reached(gates, arrive) < DP:
            assert time.monotonic() < deadline and driver.poll() is None, f"the ranks never reached {arrive}"
            time.sleep(0.01)
        if moment == IMPORTING_TORCH:
            assert _reached(gates, "torch_imported") == 0  # both past the gate before the import, neither after it
        if moment == "before_torch":  # forked from their agent, torch already in memory before any import of theirs
            for pid in _pids(gates, moment):
                agent = psutil.Process(pid).ppid()
                assert "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
                assert "scaling.engine.agent" in parent_command(agent)
                # the agent turns SIGTERM into an exception; its forked rank is ended by it, as a fresh one is
                assert _catches(agent, signal.SIGTERM) and not _catches(pid, signal.SIGTERM)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's whole group, as a killed sweep or terminal would
        driver.wait()
        _release(gates, GATE_PHASES)  # a rank still held at a gate goes on, and must notice it is alone
    assert _left_after(sweep_dir) == []
    assert not list(sweep_dir.glob("*/result.json"))  # no record: the point was cut short, not finished
