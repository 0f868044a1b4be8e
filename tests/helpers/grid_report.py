"""The report of the synthetic grid (tests/helpers/records.py's `grid_records`), written once for the tests that only
read it: its Markdown and figures (tests/test_analysis_report.py) and its page in Chromium (tests/test_report_browser.py).
A test that uses it is marked `GROUP`, so that under pytest-xdist every reader runs on the worker that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.report_writer import write_report
from tests.helpers.records import grid_records, write_sweep

GROUP = pytest.mark.xdist_group("grid_report")


_WRITTEN: dict[str, tuple[Path, dict[str, Path]]] = {}
"""The report once written in this process: each module that imports the fixture holds a definition of its own,
which pytest would run once each."""


@pytest.fixture(scope="session")
def grid_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """The sweep directory of the synthetic grid (named `grid`) and the paths `write_report` gave for it."""
    if "grid" not in _WRITTEN:
        sweep = write_sweep(tmp_path_factory.mktemp("sweep"), grid_records(), name="grid")
        _WRITTEN["grid"] = sweep, write_report(sweep)
    return _WRITTEN["grid"]
