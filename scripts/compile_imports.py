"""Compile the bytecode of what the project's processes import, by importing it once with bytecode writing on.

`make setup` installs without compiling every file (uv's --compile-bytecode compiles all of torch, transformers and
the rest: about 40 s of CPU here, most of it modules no process imports) and then runs this in the new environment:
the project's modules, and the modules they import lazily (the ranks' distributed parts, the trace, the drivers'
Hydra, W&B, pandas, seaborn, Optuna, submitit and transformers), each compiled once into its __pycache__ (16-19 s
here). Where PYTHONDONTWRITEBYTECODE is set, a process would otherwise compile each of them anew at every start (an
import of torch in 6 s instead of 2.5 s). A module that is not installed (an extra left out) is skipped; what is
compiled nowhere else is compiled at its first import by a process that may write bytecode.

    PYTHONDONTWRITEBYTECODE= VENV/bin/python scripts/compile_imports.py
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import time

LAZY = [
    "torch",
    "torch.distributed.run",
    "torch.distributed.fsdp",
    "torch.distributed.tensor.parallel",
    "torch.distributed.pipelining",
    "torch.distributed._tools.fsdp2_mem_tracker",
    "torch.distributed._tools.mem_tracker",
    "torch.distributed.optim",
    "torch.utils.checkpoint",
    "torch._subclasses.fake_tensor",
    "hydra._internal.hydra",
    "hydra._internal.core_plugins.basic_sweeper",
    "hydra._internal.core_plugins.basic_launcher",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
    "submitit",
    "wandb",
    "pandas",
    "pyarrow",
    "scipy.optimize",
    "scipy.stats",
    "seaborn",
    "matplotlib.pyplot",
    "PIL.Image",
    "optuna",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3.modeling_qwen3",
    "transformers.models.gpt2.modeling_gpt2",
]
"""Third-party modules the project imports inside functions (so importing the project's modules does not reach them)."""
PROJECT = ("scaling", "analysis", "hydra_plugins")


def modules() -> list[str]:
    """LAZY, then every module of the project's packages (their `__main__` modules left out: they run a command)."""
    names = list(LAZY)
    for package in PROJECT:
        try:
            path = importlib.import_module(package).__path__
        except ImportError:
            continue
        names += [m.name for m in pkgutil.walk_packages(path, package + ".") if not m.name.endswith("__main__")]
    return names


def main() -> None:
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        sys.exit("compile_imports: run it with PYTHONDONTWRITEBYTECODE unset (it writes the bytecode)")
    start, skipped = time.perf_counter(), []
    names = modules()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # an extra left out, or a module that needs what this environment lacks
            skipped.append(f"{name} ({type(e).__name__})")
    print(
        f"compile_imports: {len(names) - len(skipped)} modules imported and compiled in "
        f"{time.perf_counter() - start:.1f} s"
        + (f"; skipped {len(skipped)}: {', '.join(skipped[:5])}" if skipped else "")
    )


if __name__ == "__main__":
    main()
