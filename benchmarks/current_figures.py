"""RESULTS.md's "Current figures": the newest figure of each benchmark, taken from the sections below it.

Each run written up in RESULTS.md ends with a table of the figures it gives, under the header FIGURE_HEADER: one row
per figure (benchmark, figure, value, machine, date, commit, command). The current table holds, for each (benchmark,
figure), the row of the latest date (on one date, the one further down the page), with a link to the section it
came from. `python benchmarks/current_figures.py` writes it; `--check` says whether it is the sections' (exit 1 if
not; tests/test_docs_results.py runs the check).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
COLUMNS = ("benchmark", "figure", "value", "machine", "date", "commit", "command")
FIGURE_HEADER = "| " + " | ".join(COLUMNS) + " |"
CURRENT_HEADER = "| " + " | ".join((*COLUMNS, "run")) + " |"
CURRENT_SECTION = "## Current figures"


@dataclass(frozen=True)
class Figure:
    """One row of a run's figure table, and the heading of the section it stands in."""

    benchmark: str
    figure: str
    value: str
    machine: str
    date: str
    commit: str
    command: str
    section: str

    @property
    def key(self) -> tuple[str, str]:
        """What a newer row of the same figure replaces: its benchmark and figure."""
        return self.benchmark, self.figure


def slug(heading: str) -> str:
    """The #anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def figures(text: str) -> list[Figure]:
    """Every row of every figure table of the page, in page order (the current table's own rows left out)."""
    out, section, in_table = [], "", False
    for line in text.splitlines():
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        if line.strip() == FIGURE_HEADER:
            in_table = True
            continue
        if in_table and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != len(COLUMNS):
                raise ValueError(f"{section}: a figure row needs {len(COLUMNS)} cells ({', '.join(COLUMNS)}): {line}")
            out.append(Figure(*cells, section=section))
        elif not line.startswith("|"):
            in_table = False
    return out


def current(rows: list[Figure]) -> list[Figure]:
    """The newest row of each (benchmark, figure), in the order the figures first appear on the page."""
    newest: dict[tuple[str, str], Figure] = {}
    for row in rows:
        if row.key not in newest or row.date >= newest[row.key].date:
            newest[row.key] = row
    return list(newest.values())


def render(rows: list[Figure]) -> str:
    """The current table, each row linked to the section that has its run."""
    lines = [CURRENT_HEADER, "|" + "---|" * (len(COLUMNS) + 1)]
    for r in rows:
        cells = [r.benchmark, r.figure, r.value, r.machine, r.date, r.commit, r.command, f"[run](#{slug(r.section)})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_in(text: str) -> str:
    """The current table as the page has it (the lines under CURRENT_HEADER in its section)."""
    section = text.split(CURRENT_SECTION, 1)[1].split("\n## ", 1)[0]
    start = section.index(CURRENT_HEADER)
    lines = section[start:].splitlines()
    return "\n".join(line for line in lines[: next((i for i, x in enumerate(lines) if not x.startswith("|")), None)])


def main(argv: list[str]) -> int:
    """Write the current table into RESULTS.md, or with --check say whether it is the sections'."""
    text = RESULTS.read_text()
    want, have = render(current(figures(text))), table_in(text)
    if "--check" in argv:
        if want != have:
            print("RESULTS.md's current figures are not the sections' newest: run python benchmarks/current_figures.py")
            return 1
        return 0
    RESULTS.write_text(text.replace(have, want, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
