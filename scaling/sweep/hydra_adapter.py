"""The one module that imports Hydra's private API (`hydra._internal`): everything else imports it from here.

Hydra's public API has no way to run an app on a parsed command line without `sys.argv`, to split a sweep's
overrides into points as its basic sweeper does, to apply value overrides to a composed config, or to subclass its
basic sweeper and launcher. The override split and application run on hydra-core 1.3.0, the lowest pyproject.toml
allows (the grid tests of `make test-lowest`), and everything here on 1.3.8 (requirements.lock, `make test`);
pyproject.toml caps hydra-core below 1.4, where these may move.
Import it where it is used: `scaling status` never loads Hydra.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator

from hydra._internal import utils as _hydra_utils
from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.utils import _run_hydra, get_args_parser

__all__ = [
    "Callbacks",
    "apply_overrides",
    "composition_refused",
    "get_args_parser",
    "get_overrides_dirname",
    "run_hydra",
]

run_hydra = _run_hydra
"""What an `@hydra.main` app does with its parsed command line (args, args_parser, task_function, config_path,
config_name)."""


@contextlib.contextmanager
def composition_refused(refuse: Callable[[Exception], BaseException]) -> Iterator[None]:
    """While inside, an error of Hydra's composition (an unknown config choice, key or override: a HydraException or
    an OmegaConf error) leaves `run_hydra` as `refuse(error)`, a BaseException Hydra's runner lets through, where
    the runner would print it and exit 1 like any failure."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    original = _hydra_utils.run_and_report

    def run_and_report(func: Any) -> Any:
        def guarded() -> Any:
            try:
                return func()
            except (HydraException, OmegaConfBaseException) as e:
                raise refuse(e) from e

        return original(guarded)

    _hydra_utils.run_and_report = run_and_report
    try:
        yield
    finally:
        _hydra_utils.run_and_report = original


def apply_overrides(overrides: list[Any], cfg: Any) -> None:
    """Apply parsed value overrides (`train.mbs=4`) to a composed config in place, as Hydra's composition does."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


_CORE_PLUGINS = {
    "BasicLauncher": "hydra._internal.core_plugins.basic_launcher",
    "BasicSweeper": "hydra._internal.core_plugins.basic_sweeper",
}


def __getattr__(name: str) -> Any:
    """Hydra's core plugin classes, looked up at each access: Hydra's plugin scan executes the modules of
    `hydra._internal.core_plugins` again, so a class bound before the scan is no longer the one its own methods
    name (`super()` then fails)."""
    if name in _CORE_PLUGINS:
        return getattr(importlib.import_module(_CORE_PLUGINS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
