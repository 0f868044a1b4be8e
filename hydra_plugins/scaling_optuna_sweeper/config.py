"""Structured config of the `scaling_optuna` sweeper, registered under `hydra/sweeper`.

Select it with `hydra/sweeper=scaling_optuna` (or in a sweep file's defaults); every field can be
overridden as `hydra.sweeper.<field>=...`. The search space goes in `params` (one Hydra override
value per key: `choice(...)`, `range(...)`, `interval(...)`, `tag(log, interval(...))` or a comma
list); sweep overrides given on the command line join it.

Coming from hydra-optuna-sweeper, its keys work here too: `direction` (one or a list), a sampler chosen
from the `hydra/sweeper/sampler` group (`tpe`, `random`, `cmaes`, `nsgaii`, `qmc`: Optuna's classes,
any constructor argument can be set, `_target_` can name another) and `custom_search_space`. A task
may return its objective value(s) as numbers, as with that plugin, or a record (this project's way).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

DEFAULT_OBJECTIVE = "metrics.tokens_per_s_per_gpu"


@dataclass
class SamplerConf:
    """Which Optuna sampler proposes the points (`hydra/sweeper/sampler=scaling`, the default)."""

    name: str = "tpe"
    """tpe (constraint-aware, single or multi objective), random, grid (exhaustive, discrete
    parameters only) or cmaes (single objective; needs the `cmaes` package). On a finite space tpe
    and random propose an untried point while one is left (a repeat would be answered, not run)."""
    seed: Optional[int] = None
    """Seed of the sampler; a resumed study offsets it by its trial count so it does not replay."""
    n_startup_trials: int = 5
    """Random trials before TPE (or CMA-ES) starts modelling the objective."""


@dataclass
class TargetSamplerConf:
    """An Optuna sampler class built by Hydra from `_target_` (hydra-optuna-sweeper's way)."""

    _target_: str = MISSING
    seed: Optional[int] = None


@dataclass
class TPESamplerConf(TargetSamplerConf):
    """optuna.samplers.TPESampler (`hydra/sweeper/sampler=tpe`)."""

    _target_: str = "optuna.samplers.TPESampler"
    n_startup_trials: int = 10
    multivariate: bool = False
    constant_liar: bool = False


@dataclass
class RandomSamplerConf(TargetSamplerConf):
    """optuna.samplers.RandomSampler (`hydra/sweeper/sampler=random`)."""

    _target_: str = "optuna.samplers.RandomSampler"


@dataclass
class CmaEsSamplerConf(TargetSamplerConf):
    """optuna.samplers.CmaEsSampler (`hydra/sweeper/sampler=cmaes`)."""

    _target_: str = "optuna.samplers.CmaEsSampler"
    n_startup_trials: int = 1
    sigma0: Optional[float] = None


@dataclass
class NSGAIISamplerConf(TargetSamplerConf):
    """optuna.samplers.NSGAIISampler (`hydra/sweeper/sampler=nsgaii`)."""

    _target_: str = "optuna.samplers.NSGAIISampler"
    population_size: int = 50


@dataclass
class QMCSamplerConf(TargetSamplerConf):
    """optuna.samplers.QMCSampler (`hydra/sweeper/sampler=qmc`)."""

    _target_: str = "optuna.samplers.QMCSampler"
    qmc_type: str = "sobol"
    scramble: bool = False


@dataclass
class ScalingOptunaSweeperConf:
    """Search an experiment space with Optuna, resumable from its storage."""

    _target_: str = "hydra_plugins.scaling_optuna_sweeper.sweeper.ScalingOptunaSweeper"
    defaults: List[Any] = field(default_factory=lambda: [{"sampler": "scaling"}])
    objectives: List[str] = field(default_factory=lambda: [DEFAULT_OBJECTIVE])
    """Dotted names of the record fields to optimise; two or more make a multi-objective study. For a
    task that returns its value(s) as numbers they only name them (left as it is with several
    `direction`s, they become value_0, value_1, ...)."""
    directions: Optional[List[str]] = None
    """maximize or minimize, one per objective; null: `direction`, else maximize."""
    direction: Optional[Any] = None
    """hydra-optuna-sweeper's key: maximize, minimize, or a list of them (same as `directions`)."""
    sampler: Any = MISSING
    """`hydra/sweeper/sampler=scaling` (SamplerConf: name, seed, n_startup_trials), or an Optuna class:
    `hydra/sweeper/sampler=tpe|random|cmaes|nsgaii|qmc`, then `hydra.sweeper.sampler.<arg>=...`."""
    custom_search_space: Optional[str] = None
    """hydra-optuna-sweeper's key: dotted path of a function (cfg, trial) that suggests more parameters
    with `trial.suggest_*` after those of `params`; each becomes an override `name=value`."""
    n_trials: int = 20
    """Trials in the study overall: a resumed study continues until it holds this many."""
    n_jobs: int = 1
    """Trials asked per launcher batch (run concurrently by a parallel launcher)."""
    patience: Optional[int] = None
    """Stop after this many trials without a better feasible value (single objective); null: never."""
    noise_band: Optional[float] = None
    """What `patience` counts as better: a value whose band v·(1 ± band) does not overlap the best's
    (the rule the report marks ties with). null: each trial's measured band, its record's
    metrics.noise_band_frac, for throughput objectives (tokens/s, MFU, HFU, step time; 0 for others);
    a number: that band for every trial (0: any improvement counts)."""
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
    dry_run: bool = False
    """Parse the search space and print it with the study's storage and trials (`scaling sweep NAME --dry-run`);
    launch nothing and write nothing."""


ConfigStore.instance().store(
    group="hydra/sweeper",
    name="scaling_optuna",
    node=ScalingOptunaSweeperConf,
    provider="scaling",
)
for _name, _node in (
    ("scaling", SamplerConf),
    ("tpe", TPESamplerConf),
    ("random", RandomSamplerConf),
    ("cmaes", CmaEsSamplerConf),
    ("nsgaii", NSGAIISamplerConf),
    ("qmc", QMCSamplerConf),
):
    ConfigStore.instance().store(group="hydra/sweeper/sampler", name=_name, node=_node, provider="scaling")
