"""Every module of the package, the analysis and the plugins opens with a docstring that orients in at most 12 lines
(what it owns, why, where to look); derivations and tables live in docs/. Every module and dotted name a docstring
names (`scaling.x.y`, `scaling.x.y.Name`, `analysis.z`) exists, every file it names (`step_model.py`) is in the tree,
and a package's docstring names its own modules by their names (`collect`): read from the source, nothing imported."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path
from typing import Iterator, Optional

from scaling.core.model_group import HF_TARGET

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 12
ROOTS = ("scaling", "analysis", "hydra_plugins")
DATA_PACKAGES = {"scaling.conf": REPO / "conf", "scaling.sweeps": REPO / "sweeps"}
"""The shipped configs and sweeps as the installed package names them (pyproject.toml's package-dir)."""
FORMER_NAMES = {HF_TARGET, "scaling.engine.model.decoder"}
"""Factories under the names records give them (part of their job keys): scaling.model.custom.build.BUILT_IN_TARGETS
maps them to where they live now."""
DOTTED = re.compile(r"(?<![\w./-])((?:scaling|analysis|hydra_plugins)(?:\.[A-Za-z_]\w*)+)")
"""A dotted name of the project's packages (not a path's or a file's tail)."""
FILE = re.compile(r"(?<![\w/.-])([\w/]+\.py)\b")
"""A Python file a docstring names, by itself or by a path."""
SEARCHED = ("scaling", "analysis", "hydra_plugins", "benchmarks", "tests", "scripts")
"""Where a file named by itself may be, besides the module's own folder and the top of the repository."""
OWN_MODULE = re.compile(r"`([a-z_][\w.]*)`")
"""A name in backquotes in a package's docstring: one of its modules (or a name in one)."""


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


def docstrings(tree: ast.Module) -> Iterator[str]:
    """The module's, each class's and function's, and each attribute's (the string under an assignment)."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                yield stmt.value.value


def _module_path(dotted: str, base: Path) -> Optional[Path]:
    """The file of a module or package by its dotted name (a namespace package: its folder), else None."""
    for package, folder in DATA_PACKAGES.items():
        if base == REPO and (dotted == package or dotted.startswith(package + ".")):
            return folder.joinpath(*dotted[len(package) + 1 :].split(".")) if dotted != package else folder
    path = base.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return path if path.is_dir() else None


def _defined(body: list[ast.stmt]) -> dict[str, Optional[list[ast.stmt]]]:
    """The names a module or class body defines (under if/try too), each with its body when it is a class."""
    names: dict[str, Optional[list[ast.stmt]]] = {}
    for stmt in body:
        if isinstance(stmt, ast.ClassDef):
            names[stmt.name] = stmt.body
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[stmt.name] = None
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = None
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: None for a in stmt.names})
        elif isinstance(stmt, (ast.If, ast.Try)):
            for part in (stmt.body, getattr(stmt, "orelse", []), *(h.body for h in getattr(stmt, "handlers", []))):
                names.update(_defined(part))
    return names


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def exists(dotted: str, base: Path = REPO) -> bool:
    """Whether a dotted name is a module of the tree, or a name (and a class's attribute) that such a module defines."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = _module_path(".".join(parts[:i]), base)
        if path is None:
            continue
        rest = parts[i:]
        if not rest:
            return True
        if path.suffix != ".py":
            return False
        body: Optional[list[ast.stmt]] = _tree(path).body
        for name in rest:
            if body is None:  # an attribute of a function or a value: not followed further
                return True
            found = _defined(body)
            if name not in found:
                return False
            body = found[name]
        return True
    return False


def unknown_names(roots: list[Path], base: Path = REPO) -> list[str]:
    """`path: name` of each dotted name, file, or (in a package's docstring) own module that a docstring under `roots`
    gives and the tree lacks."""
    out = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            tree = _tree(path)
            for doc in docstrings(tree):
                out += [name for name in DOTTED.findall(doc) if name not in FORMER_NAMES and not exists(name, base)]
                folders = (path.parent, base, *(base / d for d in SEARCHED))
                out += [name for name in FILE.findall(doc) if not any((d / name).is_file() for d in folders)]
            if path.name == "__init__.py":
                package = ".".join(path.parent.relative_to(base).parts)
                own = OWN_MODULE.findall(ast.get_docstring(tree) or "")
                out += [name for name in own if not exists(f"{package}.{name}", base) and not exists(name, base)]
            out = [entry if ": " in entry else f"{path.relative_to(base)}: {entry}" for entry in out]
    return sorted(set(out))


def test_every_module_docstring_orients_in_at_most_twelve_lines():
    assert long_or_missing([REPO / root for root in ROOTS]) == []


def test_the_check_names_a_long_docstring(tmp_path):
    (tmp_path / "long.py").write_text('"""' + "line\n" * (MAX_LINES + 1) + '"""\n')
    (tmp_path / "short.py").write_text('"""One line."""\n')
    (tmp_path / "none.py").write_text("x = 1\n")
    assert long_or_missing([tmp_path], tmp_path) == [f"long.py: {MAX_LINES + 1}", "none.py: none"]


def test_every_dotted_name_a_docstring_gives_exists():
    assert unknown_names([REPO / root for root in ROOTS]) == []


def test_the_check_names_a_module_or_name_that_does_not_exist(tmp_path):
    """A planted tree: a package with a module, a class and a field; the docstrings name each, and five that are not
    (a module, a function, a class's attribute, a file, and a module the package's docstring calls its own)."""
    (tmp_path / "scaling" / "core").mkdir(parents=True)
    (tmp_path / "scaling" / "__init__.py").write_text('"""The package: core/enums.py and core/units.py."""\n')
    (tmp_path / "scaling" / "core" / "__init__.py").write_text(
        '"""scaling.core.enums and scaling.core.gone; `enums` and `units` (`enums.Status`)."""\n'
    )
    (tmp_path / "scaling" / "core" / "enums.py").write_text(
        '"""Statuses (scaling.core.enums.Status.ok; not scaling.core.enums.Status.lost)."""\n'
        "class Status:\n    ok = 1\n\n"
        'def f():\n    """As scaling.core.enums.f does, unlike scaling.core.enums.LIMIT."""\n'
    )
    assert unknown_names([tmp_path / "scaling"], tmp_path) == [
        "scaling/__init__.py: core/units.py",
        "scaling/core/__init__.py: scaling.core.gone",
        "scaling/core/__init__.py: units",
        "scaling/core/enums.py: scaling.core.enums.LIMIT",
        "scaling/core/enums.py: scaling.core.enums.Status.lost",
    ]
