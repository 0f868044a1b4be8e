"""The `scaling_optuna` sweeper class Hydra discovers; the search itself lives in `_impl`."""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class ScalingOptunaSweeper(Sweeper):
    """Optuna search over experiment points, resumable from its storage."""

    def __init__(
        self,
        objectives: List[str],
        directions: Optional[List[str]],
        direction: Optional[Any],
        sampler: Any,
        custom_search_space: Optional[str],
        n_trials: int,
        n_jobs: int,
        patience: Optional[int],
        noise_band: Optional[float],
        max_failure_rate: float,
        study_name: Optional[str],
        storage: Optional[str],
        params: Optional[DictConfig],
        dry_run: bool = False,
    ) -> None:
        # Optuna is imported here, when a sweep starts, not when Hydra scans its plugins (it is an extra).
        try:
            from ._impl import OptunaSearch
        except ModuleNotFoundError as e:
            if e.name is None or e.name.split(".")[0] != "optuna":
                raise
            raise ModuleNotFoundError(
                "the Optuna sweeper needs the [search] extra: pip install 'scaling[search]'", name=e.name
            ) from e

        self._search = OptunaSearch(
            objectives=list(objectives),
            directions=directions,
            direction=direction,
            sampler=sampler,
            custom_search_space=custom_search_space,
            n_trials=n_trials,
            n_jobs=n_jobs,
            patience=patience,
            noise_band=noise_band,
            max_failure_rate=max_failure_rate,
            study_name=study_name,
            storage=storage,
            params=params,
            dry_run=dry_run,
        )

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Instantiate the launcher the trials go through."""
        self._search.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        """Run the search; `arguments` are the task overrides of the command line."""
        return self._search.sweep(arguments)
