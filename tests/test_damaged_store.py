"""Records refused by name, never lost: a store holding a truncated record, a non-UTF-8 one, one that cannot be read
at all (another user's 0600 file; here, as root reads every file, its stand-in: a directory where the file would be)
and one of a newer schema_version. Every reader (a sweep re-run through the grid sweeper and run_point, `scaling
status`, `scaling report`) names each by path; a corrupt record is set aside (renamed, its bytes intact) so its
point can run again, an unreadable one is left as it is and its point not run, and a newer one stops the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.report_writer import write_report
from scaling.cli.main import main
from scaling.store.read import SET_ASIDE, NewerRecord, RecordError, load_record
from scaling.store.record import SCHEMA_VERSION, job_key
from tests.helpers.compose import compose_point
from tests.helpers.records import make_record

pytestmark = pytest.mark.subprocess  # one sweep re-run through `python -m scaling run -m`

REPO = Path(__file__).resolve().parents[1]
GRID = ["logger=none", "model=tiny", "train.seq_len=600,700,800"]
"""Three points past the tiny model's max_seq_len: each recorded `invalid` without starting a process."""
TRUNCATED = b'{"job_key": "x", "status": "ok", "config": {"tr'
NOT_UTF8 = b'{"job_key": "\xff\xfe", "status": "ok"}'


def _keys(sweep_dir: Path) -> list[str]:
    return [job_key(compose_point([*GRID[:2], f"train.seq_len={n}"], sweep_dir)) for n in (600, 700, 800)]


def _damaged(sweep_dir: Path) -> tuple[Path, Path, Path]:
    truncated, not_utf8, unreadable = (sweep_dir / k / "result.json" for k in _keys(sweep_dir))
    for path in (truncated, not_utf8):
        path.parent.mkdir(parents=True)
    truncated.write_bytes(TRUNCATED)
    not_utf8.write_bytes(NOT_UTF8)
    unreadable.mkdir(parents=True)  # reading it raises IsADirectoryError, as another user's 0600 file raises EACCES
    return truncated, not_utf8, unreadable


def test_each_kind_of_damage_is_named_with_its_path_and_reason(tmp_path):
    cases = {
        "truncated.json": (TRUNCATED, "is not whole JSON (Unterminated string", True),
        "latin1.json": (NOT_UTF8, "is not UTF-8 text (byte 13 is 0xff)", True),
        "array.json": (b"[1, 2]", "holds a JSON list, not a record (an object)", True),
    }
    for name, (data, words, corrupt) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(RecordError) as e:
            load_record(tmp_path / name)
        assert str(e.value).startswith(f"{tmp_path / name}: {words}") and e.value.corrupt is corrupt
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(RecordError, match=r"dir\.json: cannot be read \(Is a directory\): left as it is") as e:
        load_record(tmp_path / "dir.json")
    assert not e.value.corrupt
    newer = make_record()
    newer["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    with pytest.raises(NewerRecord, match="written by a newer scaling .*upgrade scaling to read it"):
        load_record(tmp_path / "newer.json")


def test_a_sweep_rerun_sets_corrupt_records_aside_runs_their_points_and_leaves_an_unreadable_one(tmp_path, capsys):
    sweep_dir = tmp_path / "store"
    truncated, not_utf8, unreadable = _damaged(sweep_dir)

    # status and report name each, by path, before anything is run
    assert main(["status", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "unreadable   3" in out
    for path in (truncated, not_utf8, unreadable):
        assert str(path.relative_to(sweep_dir)) in out, out
    md = write_report(sweep_dir, jobs=1)["markdown"].read_text()
    for path in (truncated, not_utf8, unreadable):
        assert str(path) in md

    argv = [sys.executable, "-m", "scaling", "run", "-m", *GRID, f"sweep_dir={sweep_dir}"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    both = run.stdout + run.stderr
    assert f"not run, its record cannot be read: {unreadable}: cannot be read (Is a directory)" in both
    for path, data in ((truncated, TRUNCATED), (not_utf8, NOT_UTF8)):
        (aside,) = path.parent.glob(f"result.json{SET_ASIDE}*")
        assert aside.read_bytes() == data  # set aside, never overwritten
        assert f"{path}: " in both and f"set aside as {aside.name}" in both
        assert load_record(path)["status"] == "invalid"  # the point ran again
    assert unreadable.is_dir() and not list(unreadable.iterdir())  # left as it is

    assert main(["status", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "unreadable   3" in out and "set aside: a record that could not be read" in out


def test_a_record_of_a_newer_scaling_stops_every_reader_and_is_never_rewritten(tmp_path, capsys):
    sweep_dir = tmp_path / "store"
    key = _keys(sweep_dir)[0]
    newer = make_record()
    newer.update(job_key=key, schema_version=SCHEMA_VERSION + 1, status="ok")
    path = sweep_dir / key / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(newer))
    before = path.read_bytes()
    for command in (["status", str(sweep_dir)], ["report", str(sweep_dir)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"{path}: schema_version={SCHEMA_VERSION + 1}: this store was written by a newer scaling" in err, err
    argv = [sys.executable, "-m", "scaling", "run", "-m", *GRID, f"sweep_dir={sweep_dir}"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "upgrade scaling to read it" in run.stdout + run.stderr
    assert path.read_bytes() == before
    assert list(sweep_dir.glob("*/result.json")) == [path]  # the sweep stopped before it ran any point
