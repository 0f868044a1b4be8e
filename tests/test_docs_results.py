"""benchmarks/RESULTS.md's "Current figures" is the newest figure of each benchmark in the sections below it.

The table is generated from the figure tables that end each run's write-up (benchmarks/current_figures.py): it must be
what they give now, each row naming its machine, date (ISO) and commit, its command's script or make target existing,
its link leading to the section of its run, and every number of a figure quoted from that section's text. A newer run
added to a section without the table regenerated fails here."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = (REPO / "benchmarks" / "RESULTS.md").read_text()


def _generator():
    """benchmarks/current_figures.py as a module (benchmarks/ holds scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("current_figures", REPO / "benchmarks" / "current_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


CF = _generator()


def section_text(text: str, heading: str) -> str:
    """A section's own text (its heading to the next heading), its figure tables left out, on one line."""
    kept, in_figures = [], False
    for line in text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0].splitlines():
        in_figures = line.strip() == CF.FIGURE_HEADER or (in_figures and line.startswith("|"))
        if not in_figures:
            kept.append(line)
    return " ".join(kept)


def row_problems(text: str) -> list[str]:
    """What is wrong with the figure rows of a page: a date that is not ISO, no commit, a command whose script or make
    target does not exist, a number of its value that its section's text does not hold."""
    makefile = (REPO / "Makefile").read_text()
    out = []
    for f in CF.figures(text):
        where = f"{f.benchmark} ({f.date}, {f.section})"
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", f.date):
            out.append(f"{where}: date {f.date!r} is not YYYY-MM-DD")
        if not re.fullmatch(r"[0-9a-f]{7,40}", f.commit):
            out.append(f"{where}: commit {f.commit!r} is no commit")
        if not f.machine:
            out.append(f"{where}: no machine")
        for script in re.findall(r"\b(benchmarks/\w+\.py)\b", f.command):
            if not (REPO / script).is_file():
                out.append(f"{where}: no {script}")
        for target in re.findall(r"`(?:time )?make ([\w-]+)`", f.command):
            if not re.search(rf"^{re.escape(target)}:", makefile, re.M):
                out.append(f"{where}: no make target {target}")
        body = section_text(
            text, next(h for h in re.findall(r"^#+ .*$", text, re.M) if h.lstrip("#").strip() == f.section)
        )
        out += [f"{where}: {n} is not in its section" for n in re.findall(r"\d[\d,.]*\d|\d", f.value) if n not in body]
    return out


def test_the_current_figures_are_the_newest_of_the_sections():
    rows = CF.current(CF.figures(TEXT))
    assert {"make demo", "bench_engine.py", "bench_predictor.py", "gpu_check.py", "CI"} <= {r.benchmark for r in rows}
    assert CF.table_in(TEXT) == CF.render(rows), "run python benchmarks/current_figures.py"


def test_each_figure_names_machine_date_commit_and_is_quoted_from_its_section():
    assert row_problems(TEXT) == []
    anchors = {CF.slug(h.lstrip("#")) for h in re.findall(r"^#+ .*$", TEXT, re.M)}
    assert [a for a in re.findall(r"\]\(#([^)]+)\)", CF.table_in(TEXT)) if a not in anchors] == []


def test_a_newer_run_left_out_of_the_table_fails_the_check():
    ending = "| 2026-11-27 | 7823e24 | `python benchmarks/bench_engine.py --reps 5` |"
    line = next(x for x in TEXT.splitlines() if x.endswith(ending))
    newer = line.replace("2026-11-27", "2026-12-01").replace("0.964", "1.01")
    text = TEXT.replace(line, line + "\n" + newer)  # a run of 2026-12-01 written up, the table left as it was
    assert CF.table_in(text) != CF.render(CF.current(CF.figures(text)))
    assert "| 1.01 (median of 5" in CF.render(CF.current(CF.figures(text)))
    section = "bench_engine.py — worker vs a bare DDP loop; launch overhead"
    assert row_problems(text) == [f"bench_engine.py (2026-12-01, {section}): 1.01 is not in its section"]
