"""A store a team shares: its files follow the writer's umask, the sweep index takes every driver's run, and
W&B run ids name the store as well as the sweep."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from records import make_record

from scaling.engine.jobfiles import current_umask
from scaling.store.record import RESULT_FILE, SWEEP_INDEX, Record
from scaling.sweep.progress import SweepProgress


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
