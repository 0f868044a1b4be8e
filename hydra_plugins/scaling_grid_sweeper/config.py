"""Structured config of the `scaling_grid` sweeper, registered under `hydra/sweeper`.

conf/config.yaml makes it the default, so every multirun of scaling.job.run and every grid file in
sweeps/ uses it; its `params` are Hydra's basic sweeper's (comma lists, `range(...)`, `choice(...)`)
and sweep overrides given on the command line join them, as with the basic sweeper.
"""

from dataclasses import dataclass
from typing import Dict, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class ScalingGridSweeperConf:
    """Run every point of a grid that the record store does not answer yet."""

    _target_: str = "hydra_plugins.scaling_grid_sweeper.sweeper.ScalingGridSweeper"
    max_batch_size: Optional[int] = None
    """Points handed to the launcher at once; null: every point still to run in one batch."""
    dry_run: bool = False
    """Print the grid's size, its new, recorded, predicted_oom and invalid points and an estimate of
    the wall time, and launch nothing (`scaling sweep NAME --dry-run`)."""
    compose_once: bool = True
    """Jobs of Hydra's basic launcher take their configs from the grid's compositions (one per config-group
    choice) instead of a composition each; false: the launcher composes every job again (the same config)."""
    params: Optional[Dict[str, str]] = None
    """The grid: override key -> comma list (or range/choice); plain values are fixed overrides."""


ConfigStore.instance().store(
    group="hydra/sweeper", name="scaling_grid", node=ScalingGridSweeperConf, provider="scaling"
)
