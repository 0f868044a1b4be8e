"""The config loader that Hydra's basic launcher composes each job of a sweep through.

The basic launcher composes every job's config again (`ConfigLoader.load_sweep_config`, 0.26-0.36 s a point on a
2-core CPU host), although the sweeper has composed it already: the grid sweeper each config-group choice of the grid
(scaling.sweep.grid.PointConfigs), the Optuna sweeper each trial's point (to look it up in the record store). This
loader answers `load_sweep_config` for the sweep's own master config from the sweeper's compositions (the same
config, hydra node included) and hands every other call, and every job the sweeper did not compose, to Hydra's
loader; the launcher, `run_job`, the job's `.hydra/` files and callbacks are Hydra's own.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from hydra.core.config_loader import ConfigLoader
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigSource
from hydra.types import RunMode
from omegaconf import DictConfig


class ComposedConfigLoader(ConfigLoader):
    """Hydra's config loader `loader`, with each job of `master` the sweeper composed answered by `composed(overrides)`
    (None: not composed, Hydra's loader composes it)."""

    def __init__(
        self, loader: ConfigLoader, master: DictConfig, composed: Callable[[List[str]], Optional[DictConfig]]
    ) -> None:
        self.loader, self.master, self.composed = loader, master, composed

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: List[str]) -> DictConfig:
        """The job's config: the sweeper's composition for its own master config, else Hydra's."""
        if master_config is self.master:
            cfg = self.composed(sweep_overrides)
            if cfg is not None:
                return cfg
        return self.loader.load_sweep_config(master_config, sweep_overrides)

    def load_configuration(
        self,
        config_name: Optional[str],
        overrides: List[str],
        run_mode: RunMode,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> DictConfig:
        """Hydra's."""
        return self.loader.load_configuration(
            config_name,
            overrides,
            run_mode,
            from_shell=from_shell,
            validate_sweep_overrides=validate_sweep_overrides,
        )

    def get_search_path(self) -> ConfigSearchPath:
        """Hydra's."""
        return self.loader.get_search_path()

    def get_sources(self) -> List[ConfigSource]:
        """Hydra's."""
        return self.loader.get_sources()

    def list_groups(self, parent_name: str) -> List[str]:
        """Hydra's."""
        return self.loader.list_groups(parent_name)

    def get_group_options(
        self,
        group_name: str,
        results_filter: Optional[ObjectType] = ObjectType.CONFIG,
        config_name: Optional[str] = None,
        overrides: Optional[List[str]] = None,
    ) -> List[str]:
        """Hydra's."""
        return self.loader.get_group_options(group_name, results_filter, config_name, overrides)

    def compute_defaults_list(self, config_name: Optional[str], overrides: List[str], run_mode: RunMode) -> Any:
        """Hydra's."""
        return self.loader.compute_defaults_list(config_name, overrides, run_mode)
