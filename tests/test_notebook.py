"""The exploration notebook runs top to bottom in a real ipykernel against a sweep of synthetic records."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from tests.helpers.records import grid_records, write_sweep

NOTEBOOK = Path(__file__).resolve().parents[1] / "analysis" / "notebooks" / "explore.ipynb"


@pytest.mark.subprocess
def test_notebook_executes_and_shows_heatmaps_and_dp_curve(tmp_path, monkeypatch):
    spec = KernelSpecManager().get_kernel_spec("python3")
    if spec.argv[0] not in {"python", "python3", sys.executable}:
        pytest.skip(f"kernel python3 runs {spec.argv[0]}, not this environment's python")
    sweep = write_sweep(tmp_path / "sweep", grid_records(seq_lens=(256, 512), mbss=(1, 8)))
    monkeypatch.setenv("SCALING_SWEEP_DIR", str(sweep))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    # jupyter_client runs a kernel spec's bare "python" as the client's own interpreter: this venv's
    assert f"python: {sys.executable}" in text
    assert f"{len(list(sweep.glob('*/result.json')))} records in {sweep}" in text
    assert "tiny, seq 256, mbs=1, ZeRO-0: DP stops paying off at dp=16" in text
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(images) == 7  # three standard heatmaps, the edited one, the DP curve, the seaborn facets and heatmap
    tables = [o for o in outputs if o.output_type == "execute_result" and "text/html" in o.data]
    assert any("predicted_oom" in t.data["text/plain"] for t in tables)
    assert os.environ["SCALING_SWEEP_DIR"] == str(sweep)
