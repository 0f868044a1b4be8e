"""CI's closing lines (scripts/ci_summary.py): its wall time and each lane's, read from pytest's JUnit files."""

from __future__ import annotations

import importlib.util
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ci_summary.py"
spec = importlib.util.spec_from_file_location("ci_summary", SCRIPT)
assert spec is not None and spec.loader is not None
ci_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci_summary)


@pytest.mark.parametrize(
    "seconds, words", [(570.6, "9 min 31 s"), (511.44, "8 min 31 s"), (59.6, "1 min 0 s"), (29.4, "0 min 29 s")]
)
def test_a_wall_time_is_whole_minutes_and_the_seconds_left(seconds: float, words: str) -> None:
    assert ci_summary.minutes(seconds) == words


def test_the_summary_gives_each_lanes_wall_and_the_slowest_tests(tmp_path: Path, capsys) -> None:
    xml = tmp_path / "main.xml"
    started = time.time() - 570.6
    pytest_started = datetime.fromtimestamp(started + 36.2, timezone.utc).isoformat()  # pytest's own format
    xml.write_text(
        f'<testsuites><testsuite tests="2" time="511.44" timestamp="{pytest_started}">'
        '<testcase classname="tests.test_a" name="test_slow" time="46.1"/>'
        '<testcase classname="tests.test_b" name="test_fast" time="0.2"/>'
        "</testsuite></testsuites>"
    )
    assert ci_summary.main([str(started), f"main={xml}", f"lowest={tmp_path / 'none.xml'}"]) == 0
    out = capsys.readouterr().out
    assert "CI wall time: 9 min 3" in out  # 570.6 s and the moment it took to get here
    assert "main: 2 tests, pytest's wall 8 min 31 s, started 36 s into the run" in out
    assert "lowest: no JUnit report" in out
    assert out.index("tests/test_a.py::test_slow") < out.index("tests/test_b.py::test_fast")
