"""The config loader that Hydra's basic launcher composes each job of the grid through.

The basic launcher composes every job's config again (`ConfigLoader.load_sweep_config`, 0.26-0.36 s a point on a
2-core CPU host), although the grid sweeper has already composed each config-group choice of the grid
(scaling.sweep.grid.PointConfigs). This loader answers `load_sweep_config` for the sweep's own master config from
those compositions (`PointConfigs.job_config`: the same config, hydra node included) and hands every other call to
Hydra's loader; the launcher, `run_job`, the job's `.hydra/` files and callbacks are Hydra's own.
"""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.core.config_loader import ConfigLoader
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigSource
from hydra.types import RunMode
from omegaconf import DictConfig

from scaling.sweep.grid import PointConfigs


class GridConfigLoader(ConfigLoader):
    """Hydra's config loader, with each job of the grid's master config composed from the grid's compositions."""

    def __init__(self, points: PointConfigs) -> None:
        self.points = points
        self.loader: ConfigLoader = points.loader

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: List[str]) -> DictConfig:
        """The job's config: from the grid's compositions for the grid's master config, else Hydra's."""
        if master_config is self.points.master:
            return self.points.job_config(sweep_overrides)
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
