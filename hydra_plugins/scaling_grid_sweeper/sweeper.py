"""The `scaling_grid` sweeper class Hydra discovers; the sweep itself lives in `_impl`."""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class ScalingGridSweeper(Sweeper):
    """Grid sweep that answers recorded points from the store before any job is made."""

    def __init__(
        self, max_batch_size: Optional[int], dry_run: bool, params: Optional[DictConfig], compose_once: bool = True
    ) -> None:
        from ._impl import GridSweep

        self._sweep = GridSweep(
            max_batch_size=max_batch_size, dry_run=dry_run, params=params, compose_once=compose_once
        )

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Instantiate the launcher the points go through (Hydra's basic one composes from the grid's compositions)."""
        self._sweep.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        """Run the grid's missing points; `arguments` are the task overrides of the command line."""
        return self._sweep.sweep(arguments)
