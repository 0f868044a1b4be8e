"""The HTML report as a person sees it: headless Chromium renders it without console errors.

Renders the report of a synthetic sweep, or of SCALING_REPORT_SWEEP_DIR when that is set (a
finished sweep such as runs/demo).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from analysis.report_writer import write_report
from scaling.cli.report import main as report_main
from tests.helpers.grid_report import GROUP, grid_report  # noqa: F401 (a fixture)

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)


def screenshot(page: Path, out: Path, profile: Path, size: str = "1280,2000") -> list[str]:
    """Render `page` to `out` (PNG) in a fresh profile; return the page's console lines."""
    proc = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={out}",
            f"--window-size={size}",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # every console message (log, warning, error, uncaught exception) comes out as INFO:CONSOLE
    return [line for line in proc.stderr.splitlines() if re.search(r":CONSOLE[:(]", line)]


@pytest.fixture(scope="module")
def report_html(tmp_path_factory, request) -> tuple[Path, bool]:
    """The report page, and whether it is of the synthetic sweep (which has OOM cells: the one
    tests/test_analysis_report.py reads, written once for both)."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed: apt-get install -y chromium (scripts/install-system-deps.sh)")
    sweep = os.environ.get("SCALING_REPORT_SWEEP_DIR")
    if sweep:
        return write_report(sweep, out_dir=tmp_path_factory.mktemp("report"))["html"], False
    _, paths = request.getfixturevalue("grid_report")
    return paths["html"], True


@GROUP
def test_report_renders_with_figures_and_no_console_errors(report_html, tmp_path):
    page, synthetic = report_html
    shot = tmp_path / "report.png"
    console = screenshot(page, shot, tmp_path / "profile")
    assert console == []
    assert shot.exists() and shot.stat().st_size > 20_000
    pixels = imread(shot)  # (H, W, channels) floats in [0, 1]
    assert pixels.shape[:2] == (2000, 1280)
    colours = np.unique((pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200, f"only {len(colours)} distinct colours: the page looks blank"
    if synthetic:  # its heatmaps' OOM red (#d62728) on screen: the embedded figures were decoded and drawn
        red = np.all(np.abs(pixels[..., :3] - np.array([0xD6, 0x27, 0x28]) / 255) < 0.02, axis=-1)
        assert red.sum() > 100


def test_console_check_catches_a_script_error(tmp_path):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed: apt-get install -y chromium (scripts/install-system-deps.sh)")
    page = tmp_path / "bad.html"
    page.write_text("<html><body><p>x</p><script>undefinedFunction();</script></body></html>")
    console = screenshot(page, tmp_path / "bad.png", tmp_path / "profile", size="400,300")
    assert any("Uncaught ReferenceError: undefinedFunction is not defined" in line for line in console)


def test_demo_sweep_report_opens_in_chromium(tmp_path, capsys):
    """The README's path, shrunk: `scaling sweep demo` (2 points, one out of memory, one launch each of one
    timed step), then `scaling report`. A report with every section renders above, from synthetic records."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed: apt-get install -y chromium (scripts/install-system-deps.sh)")
    import sys

    repo = Path(__file__).resolve().parents[1]
    sweep_dir = tmp_path / "demo"
    shrink = [
        "model=tiny",
        "train.seq_len=128",
        "train.mbs=2,8",
        "parallel.zero_stage=0",
        "parallel.dp=1",
        "hardware.memory_gb=0.02",
        "logger=none",
        "launch.repeats=1",
        "launch.prescreen_sample=0",
        "train.warmup_steps=0",
        "train.steps=1",
        f"sweep_dir={sweep_dir}",
    ]
    sweep = subprocess.run(
        [sys.executable, "-m", "scaling", "sweep", "demo", *shrink],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    assert "sweep demo: 2 points: 1 ok, 1 oom" in sweep.stdout, sweep.stdout[-2000:]
    assert report_main([str(sweep_dir)]) == 0  # `scaling report`'s entry, in this process (its imports are loaded)
    page = sweep_dir / "report" / "report.html"
    assert str(page) in capsys.readouterr().out
    shot = tmp_path / "demo.png"
    assert screenshot(page, shot, tmp_path / "profile") == []
    colours = np.unique((imread(shot)[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200
