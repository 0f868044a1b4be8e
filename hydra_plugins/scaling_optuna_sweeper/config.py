"""Structured config of the `scaling_optuna` sweeper, registered under `hydra/sweeper`.

Select it with `hydra/sweeper=scaling_optuna` (or in a sweep file's defaults); every field can be
overridden as `hydra.sweeper.<field>=...`. The search space goes in `params` (one Hydra override
value per key: `choice(...)`, `range(...)`, `interval(...)`, `tag(log, interval(...))` or a comma
list); sweep overrides given on the command line join it.
"""


from dataclasses import dataclass, field
from typing import Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class SamplerConf:
    """Which Optuna sampler proposes the points."""

    name: str = "tpe"
    """tpe (constraint-aware, single or multi objective), random, grid (exhaustive, discrete
    parameters only) or cmaes (single objective; needs the `cmaes` package). On a finite space tpe
    and random propose an untried point while one is left (a repeat would be answered, not run)."""
    seed: Optional[int] = None
    """Seed of the sampler; a resumed study offsets it by its trial count so it does not replay."""
    n_startup_trials: int = 5
    """Random trials before TPE (or CMA-ES) starts modelling the objective."""


@dataclass
class ScalingOptunaSweeperConf:
    """Search an experiment space with Optuna, resumable from its storage."""

    _target_: str = "hydra_plugins.scaling_optuna_sweeper.sweeper.ScalingOptunaSweeper"
    objectives: List[str] = field(default_factory=lambda: ["metrics.tokens_per_s_per_gpu"])
    """Dotted names of the record fields to optimise; two or more make a multi-objective study."""
    directions: List[str] = field(default_factory=lambda: ["maximize"])
    """maximize or minimize, one per objective."""
    sampler: SamplerConf = field(default_factory=SamplerConf)
    n_trials: int = 20
    """Trials in the study overall: a resumed study continues until it holds this many."""
    n_jobs: int = 1
    """Trials asked per launcher batch (run concurrently by a parallel launcher)."""
    patience: Optional[int] = None
    """Stop after this many trials without a better feasible value (single objective); null: never."""
    max_failure_rate: float = 1.0
    """Largest tolerated fraction of failed trials (failed, timeout, invalid); above it the sweep
    stops with an error after the batch. 1.0 tolerates every failure."""
    study_name: Optional[str] = None
    """Optuna study name; null: the config's `sweep` (or the sweep directory's name)."""
    storage: Optional[str] = None
    """Optuna storage URL (sqlite:///..., postgresql://...) or a journal file path;
    null: a journal file `optuna.journal` in hydra.sweep.dir."""
    params: Optional[Dict[str, str]] = None
    """Search space: override key -> Hydra sweep expression; plain values are fixed overrides."""


ConfigStore.instance().store(
    group="hydra/sweeper",
    name="scaling_optuna",
    node=ScalingOptunaSweeperConf,
    provider="scaling",
)
