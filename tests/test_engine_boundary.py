"""The engine boundary as a check: everything torchrun runs imports torch and the standard library only."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER_ONLY = ("hydra", "omegaconf", "pandas", "wandb", "optuna", "matplotlib", "seaborn", "psutil", "submitit",
               "numpy", "yaml")
"""Libraries of the sweep driver and the analysis that a bare GPU box with torch need not have."""


def test_engine_imports_with_the_driver_libraries_unimportable() -> None:
    """Import every module of scaling.engine in a fresh interpreter where the driver's libraries cannot be found."""
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, pkgutil, sys
        BLOCKED = {DRIVER_ONLY!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"{{name}} is blocked: the engine must not need it", name=name)

        sys.meta_path.insert(0, Block())
        import scaling.engine
        names = [m.name for m in pkgutil.walk_packages(scaling.engine.__path__, "scaling.engine.")]
        for name in names:
            importlib.import_module(name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not leaked, leaked
        print(" ".join(names))
    """)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = set(proc.stdout.split())
    assert {"scaling.engine.worker", "scaling.engine.model", "scaling.engine.parallel", "scaling.engine.data"} <= imported


def test_the_boundary_check_catches_a_driver_import(tmp_path: Path) -> None:
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
