"""The fingerprint of a model's code: a hash of the source files of the user's modules that make the model (the
target's module and, transitively, the project's modules it uses). It is recorded with each point
(`provenance.model_code`) and is not part of the job key: a `failed`, `timeout` or `invalid` point recorded with
other code runs again (scaling.store.record.answers), so an edited model is measured again while the keys of
existing records stay. It imports the user's module (and so torch), nothing of it is built.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Optional

from scaling.core.model_group import CustomModel

INSTALLED = tuple(
    {str(Path(p).resolve()) for p in (sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))}
)
"""Where the interpreter's own and installed modules live: never part of a project's code."""
SCALING = str(Path(__file__).resolve().parents[2])
"""The scaling package: its own factories are versioned with it, not fingerprinted."""


def _project_file(module: ModuleType, roots: tuple[str, ...]) -> Optional[Path]:
    """The source file of a module of the user's project (under the working directory or PYTHONPATH, outside
    installed packages and scaling), else None."""
    origin = getattr(module, "__file__", None)
    if not origin or not origin.endswith(".py"):
        return None
    path = str(Path(origin).resolve())
    outside = path.startswith(INSTALLED) or path.startswith(SCALING + os.sep)
    return None if outside or not path.startswith(roots) else Path(path)


def _fingerprint(dotted: tuple[str, ...], roots: tuple[str, ...]) -> Optional[str]:
    queue = [importlib.import_module(d.rpartition(".")[0]) for d in dotted]
    seen: dict[str, Path] = {}
    while queue:
        module = queue.pop()
        path = _project_file(module, roots)
        if path is None or module.__name__ in seen:
            continue
        seen[module.__name__] = path
        for value in list(vars(module).values()):  # the project modules it imports, or whose names it holds
            owner = getattr(value, "__module__", None)
            used = (
                value if isinstance(value, ModuleType) else sys.modules.get(owner) if isinstance(owner, str) else None
            )
            if used is not None and used.__name__ not in seen:
                queue.append(used)
    if not seen:
        return None
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(f"{name}\0".encode() + seen[name].read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def model_code(model: CustomModel) -> Optional[str]:
    """The fingerprint of a model the user brings (16 hex digits; None for scaling's own factories, or when its
    module does not import: the contract check says why)."""
    from scaling.model.custom.build import BUILT_IN_TARGETS, project_importable

    dotted = tuple(d for d in (model.target, model.blocks) if isinstance(d, str) and "." in d)
    if not dotted or model.target in BUILT_IN_TARGETS:
        return None
    project_importable()
    roots = tuple(str(Path(p).resolve()) + os.sep for p in sys.path if p and Path(p).is_dir())
    try:
        return _fingerprint(dotted, roots)
    except Exception:  # the user's module may raise anything on import: the contract check names it
        return None
