"""A store under faults, on real mounts: a read-only store is read by every command that only reads, and a run that
would write into it stops in one line naming it.

Mounting needs root, as CI runs; elsewhere these tests skip and say why."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from scaling.cli.main import main
from tests.helpers.cli import scaling

pytestmark = pytest.mark.subprocess  # real mounts, real drivers

TWO_INVALID = """# two points past the tiny model's max_seq_len: recorded `invalid`, no process started
defaults:
  - config
  - _self_
sweep: faults
logger: {mode: disabled}
hydra:
  mode: MULTIRUN
  sweeper:
    params:
      train.seq_len: 600,700
"""


@contextlib.contextmanager
def read_only(source: Path, at: Path) -> Iterator[Path]:
    """`source` seen read-only at `at` (a bind mount, remounted read-only), unmounted on the way out."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (CI runs the tests as root)")
    at.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(at)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(at)], check=True)
        yield at
    finally:
        subprocess.run(["umount", str(at)], check=True)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root`, with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_a_read_only_store_is_read_by_status_report_predict_and_a_rerun_and_a_run_that_would_write_stops(
    tmp_path, capsys
):
    sweep_file = tmp_path / "two_invalid.yaml"
    sweep_file.write_text(TWO_INVALID)
    store = tmp_path / "store"
    first = scaling("sweep", str(sweep_file), f"sweep_dir={store}")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    before = _tree(store)

    with read_only(store, tmp_path / "ro") as ro:
        assert main(["status", str(ro)]) == 0
        assert "done         2  2 invalid" in capsys.readouterr().out

        assert main(["report", str(ro), "--out", str(tmp_path / "elsewhere"), "--jobs", "1"]) == 0
        assert (tmp_path / "elsewhere" / "report.md").is_file()
        capsys.readouterr()
        assert main(["report", str(ro), "--jobs", "1"]) == 1
        err = capsys.readouterr().err
        assert f"scaling report: cannot write {ro / 'report'} (Read-only file system)" in err, err
        assert "pass --out DIR to write it elsewhere" in err and "Traceback" not in err

        assert main(["predict", "--sweep", str(sweep_file), f"sweep_dir={ro}"]) == 0
        assert "2 recorded (2 invalid)" in capsys.readouterr().out

        rerun = scaling("sweep", str(sweep_file), f"sweep_dir={ro}")
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
        assert "2 points already recorded (2 invalid): not launched again" in rerun.stdout
        assert f"sweep faults: 2 points: 2 invalid ({ro})" in rerun.stdout
        assert "Traceback" not in rerun.stderr and "Warning" not in rerun.stderr, rerun.stderr

        more = scaling("sweep", str(sweep_file), f"sweep_dir={ro}", "train.seq_len=600,700,800")
        assert more.returncode == 1, more.stdout[-2000:] + more.stderr[-2000:]
        assert more.stderr.strip().splitlines()[-1] == (
            f"scaling sweep: cannot write {ro / '.sweep.json.lock'} (Read-only file system): the store is read-only "
            "here: 1 point still to run, not run"
        ), more.stderr
    assert _tree(store) == before
