"""Every module of the package, the analysis and the plugins opens with a docstring that orients in at most 12 lines
(what it owns, why, where to look); derivations and tables live in docs/."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 12


def long_or_missing(roots: list[Path], base: Path = REPO) -> list[str]:
    """`path: n` of each module whose docstring is over MAX_LINES lines, `path: none` of each without one."""
    out = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
            lines = len(doc.strip("\n").splitlines()) if doc else 0
            if doc is None or lines > MAX_LINES:
                out.append(f"{path.relative_to(base)}: {lines or 'none'}")
    return out


def test_every_module_docstring_orients_in_at_most_twelve_lines():
    assert long_or_missing([REPO / "scaling", REPO / "analysis", REPO / "hydra_plugins"]) == []


def test_the_check_names_a_long_docstring(tmp_path):
    (tmp_path / "long.py").write_text('"""' + "line\n" * (MAX_LINES + 1) + '"""\n')
    (tmp_path / "short.py").write_text('"""One line."""\n')
    (tmp_path / "none.py").write_text("x = 1\n")
    assert long_or_missing([tmp_path], tmp_path) == [f"long.py: {MAX_LINES + 1}", "none.py: none"]
