"""`make gpu-check` on a machine without CUDA: it plans and validates its points, then says that no CUDA device
was found and exits non-zero, measuring nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.compose import REPO


def test_gpu_check_without_cuda_says_so_and_fails(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: make gpu-check measures it instead")
    out = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--budget-s", "10", "--sweep-dir", str(tmp_path / "gc")],
        cwd=REPO,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert out.returncode == 1
    text = out.stdout + out.stderr
    assert "composed and validated 12 planned points" in text
    assert "no CUDA device found" in text and "nothing was measured" in text
    assert not list((tmp_path / "gc").glob("*/result.json"))  # no point ran
