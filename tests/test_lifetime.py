"""No rank outlives its sweep: the driver SIGKILLed at many moments of a point's start-up leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import processes_mentioning

REPO = Path(__file__).resolve().parents[1]
MOMENTS_S = (0.0, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5, 1.7, 2.0)
"""Delays after the first rank process appears: before, during and after the ranks' `import torch`."""


def _is_rank(cmdline: str) -> bool:
    """A rank's command line names the worker; torchrun's names it too, after torch.distributed.run."""
    return "scaling.engine.worker" in cmdline and "torch.distributed.run" not in cmdline


def _wait_for_rank(sweep_dir: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(_is_rank(" ".join(p.info["cmdline"] or [])) for p in processes_mentioning(str(sweep_dir))):
        assert time.monotonic() < deadline, "no rank started"
        time.sleep(0.02)


def _left_after(sweep_dir: Path, settle_s: float = 10.0) -> list[str]:
    """Processes of the point still alive once the kernel has had `settle_s` to deliver the death signals."""
    deadline = time.monotonic() + settle_s
    while (left := processes_mentioning(str(sweep_dir))) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [" ".join(p.info["cmdline"] or [])[:120] for p in left]


@pytest.mark.parametrize("delay_s", MOMENTS_S)
def test_killing_the_driver_at_any_moment_of_start_up_leaves_no_process(tmp_path, delay_s):
    sweep_dir = tmp_path / "sweep"
    driver = subprocess.Popen(
        [sys.executable, "-m", "scaling", "run", "model=tiny", "train.seq_len=64", "parallel.dp=2", "logger=none",
         "train.steps=200", f"sweep_dir={sweep_dir}"],
        cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_rank(sweep_dir)
        time.sleep(delay_s)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's whole group, as a killed sweep or terminal would
        driver.wait()
    assert _left_after(sweep_dir) == []
    assert not list(sweep_dir.glob("*/result.json"))  # no record: the point was cut short, not finished
