"""The layers of the package as checks: import-linter's contracts (pyproject.toml) hold on the tree and break when
a module imports across them, the engine imports with the driver's libraries unimportable, and `scaling status`
and `scaling report` load no torch."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("scaling", "analysis", "hydra_plugins")
DRIVER_ONLY = (
    "hydra",
    "omegaconf",
    "pandas",
    "wandb",
    "optuna",
    "matplotlib",
    "seaborn",
    "psutil",
    "submitit",
    "numpy",
    "yaml",
)
"""Libraries of the sweep driver and the analysis that a bare GPU box with torch need not have."""
INJECTED = {
    "scaling/core/units.py": ("import scaling.cli.main", "scaling in layers", "scaling.core.units -> scaling.cli.main"),
    "scaling/store/record.py": (
        "import hydra_plugins.scaling_grid_sweeper",
        "scaling never imports hydra_plugins",
        "scaling.store.record -> hydra_plugins.scaling_grid_sweeper",
    ),
    "analysis/figures.py": (
        "import scaling.sweep.grid",
        "analysis reads records and never launches",
        "analysis.figures -> scaling.sweep.grid",
    ),
    "scaling/engine/jobfiles.py": (
        "import numpy",
        "the engine imports torch and the standard library only",
        "scaling.engine.jobfiles -> numpy",
    ),
    "scaling/predictor/prescreen.py": (
        "import analysis.collect",
        "scaling and analysis",
        "scaling.predictor.prescreen -> analysis.collect",
    ),
    "scaling/core/batch.py": ("import torch", "core imports the standard library only", "scaling.core.batch -> torch"),
    "scaling/model/shape.py": (
        "import yaml",
        "the model folder imports torch, the standard library and scaling.core only",
        "scaling.model.shape -> yaml",
    ),
    "scaling/perf/knee.py": (
        "import scaling.store.read",
        "the performance model reads no record, launches nothing and imports no torch",
        "scaling.perf.knee -> scaling.store.read",
    ),
}
"""One import across each contract, the contract it breaks and the import lint-imports names."""


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """lint-imports with the repository's contracts on the packages found from `cwd` (it comes first on the path)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.subprocess
def test_the_tree_keeps_every_import_contract() -> None:
    out = lint_imports(REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert " 0 broken" in out.stdout


@pytest.mark.subprocess
def test_an_import_across_each_contract_breaks_it(tmp_path: Path) -> None:
    """A copy of the packages with one forbidden import per contract: every contract is reported broken, by name,
    with the import that breaks it."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    for path, (line, _, _) in INJECTED.items():
        with open(tmp_path / path, "a") as f:
            f.write(f"\n{line}\n")
    out = lint_imports(tmp_path)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    text = " ".join(out.stdout.split())  # long contract names wrap
    for _, contract, named in INJECTED.values():
        assert f"{contract}" in text and named in text, (contract, out.stdout[-3000:])
    assert "0 kept" in text and " KEPT" not in text


@pytest.mark.subprocess
def test_engine_imports_with_the_driver_libraries_unimportable() -> None:
    """Import every module of scaling.engine and of what it stands on (scaling.model, scaling.core) in a fresh
    interpreter where the driver's libraries cannot be found."""
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, pkgutil, sys
        BLOCKED = {DRIVER_ONLY!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"{{name}} is blocked: the engine must not need it", name=name)

        sys.meta_path.insert(0, Block())
        import scaling.core, scaling.engine, scaling.model
        packages = (scaling.core, scaling.model, scaling.engine)
        names = [m.name for p in packages for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")]
        for name in names:
            importlib.import_module(name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not leaked, leaked
        print(" ".join(names))
    """)
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = set(proc.stdout.split())
    assert {
        "scaling.engine.worker",
        "scaling.model.llama.decoder",
        "scaling.engine.parallel",
        "scaling.engine.data",
        "scaling.core.schema",
    } <= imported


@pytest.mark.subprocess
def test_the_boundary_check_catches_a_driver_import() -> None:
    """The same blocker makes an import of a driver library fail, so the check above can fail."""
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {DRIVER_ONLY!r}:
                    raise ModuleNotFoundError(name, name=name)
        sys.meta_path.insert(0, Block())
        import scaling.job.run
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


@pytest.mark.parametrize(
    ("module", "loads_torch"),
    [("scaling.cli.status", False), ("scaling.cli.report", False), ("scaling.model.llama.decoder", True)],
)
@pytest.mark.subprocess
def test_status_and_report_load_no_torch(module: str, loads_torch: bool) -> None:
    """`scaling status` and `scaling report` read records: importing their commands in a fresh interpreter loads
    no torch (the engine's model, which does, shows the probe sees it)."""
    probe = f"import sys, {module}; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(loads_torch)


def private_hydra_importers(root: Path) -> list[str]:
    """The project's Python files under `root` (its packages, tests and benchmarks) that import `hydra._internal`,
    at any depth of the file."""
    found = []
    for path in sorted(p for folder in (*PACKAGES, "tests", "benchmarks") for p in (root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n == "hydra._internal" or n.startswith("hydra._internal.") for n in names):
                found.append(str(path.relative_to(root)))
                break
    return found


def test_one_module_imports_hydras_private_api(tmp_path: Path) -> None:
    assert private_hydra_importers(REPO) == ["scaling/sweep/hydra_adapter.py"]
    (tmp_path / "scaling").mkdir()
    (tmp_path / "scaling" / "late.py").write_text("def f():\n    from hydra._internal.utils import _run_hydra\n")
    assert private_hydra_importers(tmp_path) == ["scaling/late.py"]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project's modules it imports, at its top or inside a function (a lazy import closes a circle
    all the same)."""
    modules = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_module_imports_itself_through_others(tmp_path: Path) -> None:
    """No import circle anywhere in the tree (a lazy import inside a function counts); a planted one is found."""
    assert import_circles(import_graph(REPO)) == []
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "scaling/core/units.py", "a") as f:  # core imports the layout, which now imports core.units
        f.write("\n\ndef _planted() -> None:\n    import scaling.core.layout  # noqa: F401\n")
    with open(tmp_path / "scaling/core/layout.py", "a") as f:
        f.write("\n\ndef _planted() -> None:\n    import scaling.core.units  # noqa: F401\n")
    assert import_circles(import_graph(tmp_path)) == [["scaling.core.layout", "scaling.core.units"]]
