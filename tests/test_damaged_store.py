"""Records refused by name, never lost: a store holding a truncated record, a non-UTF-8 one, one that cannot be read
at all (another user's 0600 file; here, as root reads every file, its stand-in: a directory where the file would be),
another point's record copied and linked into a point's folder, a JSON object that is no record, a dangling link, and
one of a newer schema_version. Every reader (a sweep re-run through the grid sweeper and run_point, `scaling status`,
`scaling report`) names each by path; a corrupt or foreign one is set aside (renamed, its bytes or its link intact)
so its point can run again, an unreadable one is left as it is, its point not run and the run exits 1 naming it,
and a newer one stops the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.report_writer import write_report
from scaling.cli.main import main
from scaling.store.read import SET_ASIDE, NewerRecord, RecordError, load_record
from scaling.store.record import SCHEMA_VERSION, Record, job_key
from tests.helpers.compose import compose_point
from tests.helpers.records import make_record

pytestmark = pytest.mark.subprocess  # one sweep re-run through `python -m scaling run -m`

REPO = Path(__file__).resolve().parents[1]
SEQ_LENS = (600, 700, 800, 900, 1000, 1100, 1200)
GRID = ["logger=none", "model=tiny", f"train.seq_len={','.join(map(str, SEQ_LENS))}"]
"""Seven points past the tiny model's max_seq_len: each recorded `invalid` without starting a process."""
TRUNCATED = b'{"job_key": "x", "status": "ok", "config": {"tr'
NOT_UTF8 = b'{"job_key": "\xff\xfe", "status": "ok"}'
NOT_A_RECORD = b'{"loss": 6.2, "note": "a notebook\'s output"}'


def _keys(sweep_dir: Path, seq_lens=SEQ_LENS) -> list[str]:
    return [job_key(compose_point([*GRID[:2], f"train.seq_len={n}"], sweep_dir)) for n in seq_lens]


def _damaged(sweep_dir: Path) -> dict[str, Path]:
    """Every kind of damage, one per point of GRID, by name; `other` is a sound record of a point outside it."""
    names = ("truncated", "not_utf8", "unreadable", "copied", "linked", "not_a_record", "dangling")
    paths = {name: sweep_dir / k / "result.json" for name, k in zip(names, _keys(sweep_dir))}
    (other_key,) = _keys(sweep_dir, (1300,))
    paths["other"] = sweep_dir / other_key / "result.json"
    Record(
        job_key=other_key, status="invalid", config=compose_point([*GRID[:2], "train.seq_len=1300"]).experiment()
    ).write(paths["other"])
    for name in ("truncated", "not_utf8", "copied", "linked", "not_a_record", "dangling"):
        paths[name].parent.mkdir(parents=True)
    paths["truncated"].write_bytes(TRUNCATED)
    paths["not_utf8"].write_bytes(NOT_UTF8)
    paths["unreadable"].mkdir(parents=True)  # reading it raises IsADirectoryError, as another user's 0600 file EACCES
    paths["copied"].write_bytes(paths["other"].read_bytes())  # a hand-merged store, a bad rsync
    paths["linked"].symlink_to(paths["other"])
    paths["not_a_record"].write_bytes(NOT_A_RECORD)
    paths["dangling"].symlink_to(sweep_dir / "moved-away" / "result.json")
    return paths


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


def test_a_sweep_rerun_sets_corrupt_and_foreign_records_aside_runs_their_points_and_leaves_an_unreadable_one(
    tmp_path, capsys
):
    sweep_dir = tmp_path / "store"
    paths = _damaged(sweep_dir)
    damaged = [name for name in paths if name != "other"]
    other_bytes = paths["other"].read_bytes()

    # status and report name each, by path, before anything is run
    assert main(["status", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert f"unreadable {len(damaged):3d}" in out and "done         1  1 invalid" in out, out
    for name in damaged:
        assert str(paths[name].relative_to(sweep_dir)) in out, (name, out)
    assert f"holds the record of point {paths['other'].parent.name}, not of its folder's point" in out
    assert "holds a JSON object that is not a record" in out and "which does not exist" in out
    md = write_report(sweep_dir, jobs=1)["markdown"].read_text()
    for name in damaged:
        assert str(paths[name]) in md, name

    argv = [sys.executable, "-m", "scaling", "run", "-m", *GRID, f"sweep_dir={sweep_dir}"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    both = run.stdout + run.stderr
    assert run.returncode == 1, both[-3000:]  # a point it could not run is not a complete run
    unreadable = paths["unreadable"]
    assert f"sweep adhoc: {len(SEQ_LENS) + 1} points: 7 invalid, 1 not run" in run.stdout, run.stdout
    assert f"not run {unreadable.parent.name}: its record cannot be read: {unreadable}: cannot be read" in run.stdout
    assert "1 not run of 8 points (the points not run are named above" in run.stderr
    for name, kept in (("truncated", TRUNCATED), ("not_utf8", NOT_UTF8), ("copied", other_bytes)):
        (aside,) = paths[name].parent.glob(f"result.json{SET_ASIDE}*")
        assert aside.read_bytes() == kept  # set aside, never overwritten
        assert f"{paths[name]}: " in both and f"set aside as {aside.name}" in both
    (aside,) = paths["not_a_record"].parent.glob(f"result.json{SET_ASIDE}*")
    assert aside.read_bytes() == NOT_A_RECORD
    for name, target in (("linked", paths["other"]), ("dangling", sweep_dir / "moved-away" / "result.json")):
        (aside,) = paths[name].parent.glob(f"result.json{SET_ASIDE}*")
        assert aside.is_symlink() and Path(os.readlink(aside)) == target  # the link moved as itself
    assert paths["other"].read_bytes() == other_bytes  # the point it was copied from is left as it was
    for name in damaged:
        if name != "unreadable":
            assert load_record(paths[name], paths[name].parent.name)["status"] == "invalid"  # its point ran again
    assert unreadable.is_dir() and not list(unreadable.iterdir())  # left as it is

    assert main(["status", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert f"unreadable {len(damaged):3d}" in out and "set aside: a record that could not be read" in out


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
