"""`make gpu-check` on a machine without CUDA: it plans and validates its points, then says that no CUDA device
was found and exits non-zero, measuring nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.compose import REPO


@pytest.mark.subprocess
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
    assert "composed and validated 18 planned points" in text
    assert "no CUDA device found" in text and "nothing was measured" in text
    assert not list((tmp_path / "gc").glob("*/result.json"))  # no point ran


def test_the_page_states_the_predictors_error_on_eager_and_on_compiled_points_apart():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    check = gpu_check.Check("h100", REPO / "unused", 0)
    base = dict.fromkeys(("tokens_per_s_per_gpu", "mfu", "step_spread", "peak_reserved", "device_used", "build_peak"))
    for compiled, predicted in ((0, 101), (0, 99), (0, 100), (1, 105), (1, 107)):
        check.rows.append(
            {**base, "part": "a", "seq": 4096, "mbs": 1, "zero": 0, "recompute": "none", "compile": compiled}
            | {"status": "ok", "peak_alloc": 100, "predicted": predicted, "kernel": None, "compile_s": None}
        )
    page = "\n".join(gpu_check.summary(check, "NVIDIA H100"))
    assert "on 3 eager points: median |error| 1.0%, largest 1.0%" in page and "largest <= 6%: met." in page
    assert "on 2 compiled points: median |error| 6.0%, largest 7.0%" in page and "largest <= 6%: NOT met." in page


def test_the_allocator_history_is_read_at_its_peak_and_compared_by_allocation_site():
    """(f) reads a `torch.cuda.memory._snapshot()`: allocations and frees replayed in order, what was live at the
    most-allocated moment summed by site (the innermost Python frame and the innermost one of this project)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    def frames(*where):
        return [{"filename": f"/x/site-packages/{f}", "line": n, "name": fn} for f, n, fn in where]

    step = frames(("torch/nn/functional.py", 10, "linear"), ("scaling/engine/step.py", 40, "train_step"))
    optim = frames(("torch/optim/adamw.py", 5, "_init_group"), ("scaling/engine/step.py", 44, "train_step"))
    events = [
        {"action": "segment_alloc", "addr": 0, "size": 4096, "frames": []},
        {"action": "alloc", "addr": 1, "size": 100, "frames": optim},
        {"action": "alloc", "addr": 2, "size": 300, "frames": step},
        {"action": "alloc", "addr": 3, "size": 200, "frames": step},  # the peak: 600
        {"action": "free_requested", "addr": 2, "size": 300, "frames": step},
        {"action": "free_completed", "addr": 2, "size": 300, "frames": step},
        {"action": "alloc", "addr": 4, "size": 250, "frames": optim},  # 550: below the peak
    ]
    peak, sites = gpu_check.snapshot_at_peak({"device_traces": [events]})
    assert peak == 600
    assert sites == {
        "torch/nn/functional.py:10 linear < scaling/engine/step.py:40 train_step": 500,
        "torch/optim/adamw.py:5 _init_group < scaling/engine/step.py:44 train_step": 100,
    }
    other = {**sites, "torch/optim/adamw.py:5 _init_group < scaling/engine/step.py:44 train_step": 400, "new": 7}
    assert gpu_check.snapshot_difference(sites, other) == [
        ("torch/optim/adamw.py:5 _init_group < scaling/engine/step.py:44 train_step", 300),
        ("new", 7),
    ]
