"""A store a team shares: its files follow the writer's umask, the sweep index takes every driver's run, and
W&B run ids name the store as well as the sweep."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from scaling.core.files import current_umask
from scaling.engine.jobfiles import RESULT_FILE
from scaling.store.index import path_id, store_id, update_index
from scaling.store.record import SWEEP_INDEX, Record
from scaling.store.wandb_runs import run_id
from scaling.sweep.progress import SweepProgress
from tests.helpers.records import make_record


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def multirun_config(sweep_dir: Path):
    """The part of a composed multirun config SweepProgress reads."""
    return OmegaConf.create(
        {
            "sweep": "shared",
            "hardware": {"name": "cpu"},
            "hydra": {
                "sweep": {"dir": str(sweep_dir)},
                "sweeper": {"_target_": "grid", "params": {"parallel.dp": "1,2"}},
                "launcher": {"_target_": "basic"},
                "overrides": {"task": []},
            },
        }
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600)])
def test_records_and_the_index_are_written_under_the_umask(tmp_path, mask, expected):
    record = Record.from_dict(make_record())
    with umask(mask):
        assert current_umask() == mask
        record.write(tmp_path / record.job_key / RESULT_FILE)
        SweepProgress().on_multirun_start(multirun_config(tmp_path))
    assert mode(tmp_path / record.job_key / RESULT_FILE) == expected
    assert mode(tmp_path / SWEEP_INDEX) == expected


ADD_ENTRIES = """
import sys
from scaling.store.index import update_index

sweep_dir, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.stdin.read(1)  # the gate: both writers start together
for i in range(n):
    update_index(sweep_dir, lambda index: index.setdefault("runs", []).append(f"{tag}-{i}"))
"""


@pytest.mark.subprocess
def test_two_drivers_updating_the_index_at_once_lose_no_entry(tmp_path):
    n = 150
    writers = [
        subprocess.Popen([sys.executable, "-c", ADD_ENTRIES, str(tmp_path), tag, str(n)], stdin=subprocess.PIPE)
        for tag in ("a", "b")
    ]
    for writer in writers:
        writer.stdin.write(b"go")
        writer.stdin.close()
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    runs = json.loads((tmp_path / SWEEP_INDEX).read_text())["runs"]
    assert sorted(runs) == sorted(f"{tag}-{i}" for tag in ("a", "b") for i in range(n))


def test_run_ids_name_the_store_and_a_moved_store_keeps_its_id(tmp_path):
    record = make_record(sweep="s" * 60)
    record["provenance"]["attempt"] = 123
    first, second = tmp_path / "a" / "runs", tmp_path / "b" / "runs"
    assert store_id(first) == path_id(first) != path_id(second)
    ids = {run_id(record, store_id(d)) for d in (first, second)}
    assert len(ids) == 2
    assert all(len(i) <= 64 and re.fullmatch(r"[A-Za-z0-9_.-]+", i) for i in ids)

    update_index(first, lambda index: None)  # sweep.json keeps the id from its first update on
    moved = tmp_path / "moved"
    first.rename(moved)
    assert store_id(moved) == path_id(first) != path_id(moved)
