"""The Optuna study of a sweep: storage, sampler, resume, and the counts that decide when to stop.

Resume: the study is loaded from its storage, so finished trials are never asked again. A trial
still RUNNING when the study is opened was left by a driver that died (one driver per study is
assumed): it is marked FAIL with the user attr `stale`, does not count towards `n_trials` or the
failure rate, and its parameters are enqueued so the next trial retries them (a point that did
get recorded before the driver died is then answered from the record store, not re-measured).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.samplers import (
    BaseSampler,
    CmaEsSampler,
    GridSampler,
    RandomSampler,
    TPESampler,
)
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from scaling.core.noise import NOISE_BAND_KEY, THROUGHPUT_KEYS, within_noise

from ._outcome import is_feasible
from ._space import SearchSpace

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random", "grid", "cmaes")
MAX_LISTED_POINTS = 100_000
"""Largest finite space `UntriedFirst` lists point by point; a larger one is sampled as it is."""
DIRECTIONS = ("maximize", "minimize")
JOURNAL_FILE = "optuna.journal"


def make_storage(storage: Optional[str], sweep_dir: Path) -> BaseStorage | str:
    """A journal file (default `<sweep_dir>/optuna.journal`, or the given path) or an Optuna URL."""
    if storage is not None and "://" in storage:
        return storage
    path = Path(storage) if storage is not None else sweep_dir / JOURNAL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


class AskTellGridSampler(GridSampler):
    """GridSampler for ask/tell batches: the loop asks no more trials than there are points not yet
    taken (GridSampler would hand out a taken one again) and stops when none is left, instead of the
    `Study.stop()` GridSampler calls, which works only inside `Study.optimize`."""

    def __init__(self, grid: dict[str, list[Any]], seed: Optional[int]) -> None:
        super().__init__(grid, seed=seed)
        self.grid = {name: list(values) for name, values in sorted(grid.items())}
        self.n_points = math.prod(len(values) for values in grid.values())

    def points_left(self, study: Study) -> int:
        """Grid points no trial of this grid has taken yet (finished or running)."""
        taken = {
            t.system_attrs["grid_id"]
            for t in study.get_trials(deepcopy=False, states=[TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL])
            if "grid_id" in t.system_attrs and t.system_attrs.get("search_space") == self.grid
        }
        return self.n_points - len(taken)

    def after_trial(
        self, study: Study, trial: FrozenTrial, state: TrialState, values: Optional[Sequence[float]]
    ) -> None:
        """Nothing to record: the grid's progress is read from the study's trials."""


class UntriedFirst(BaseSampler):
    """TPE or random search over a finite space that proposes a point no trial has tried, while one is left.

    The sweeper answers a repeated point from its earlier trial without a job, so a repeat costs a
    trial and teaches the sampler nothing, and TPE, which proposes the best point its model knows,
    repeats the best measured point more and more often on a small grid. Each proposal of the inner
    sampler that was tried already is drawn again, up to `tries` times; then the untried point nearest
    to it (fewest parameters changed) is taken. While TPE still samples at random, and for random
    search, the point is drawn uniformly from the untried ones (random search without replacement).
    """

    def __init__(
        self, inner: BaseSampler, space: SearchSpace, grid: dict[str, list[Any]], seed: Optional[int], tries: int = 16
    ) -> None:
        self.inner, self.tries = inner, tries
        self.distributions = dict(space.distributions)
        self.names = list(grid)
        self.points = list(itertools.product(*grid.values()))
        self._keys = [self._key(point) for point in self.points]
        self._rng = random.Random(seed)

    @staticmethod
    def _key(values: Sequence[Any]) -> tuple:
        # float steps sampled by Optuna may carry binary noise (0.30000000000000004) the grid lacks
        return tuple(round(v, 9) if isinstance(v, float) else v for v in values)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """The whole space: every parameter of a trial is chosen together, here."""
        return dict(self.distributions)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """An untried point as {name: value}; the inner sampler's own proposal once every point was tried."""
        if set(search_space) != set(self.names):
            return self.inner.sample_relative(study, trial, search_space)
        tried = {
            self._key([t.params.get(name) for name in self.names])
            for t in study.get_trials(deepcopy=False)
            if t.number != trial.number and not t.user_attrs.get("stale")
        }
        untried = [point for point, key in zip(self.points, self._keys) if key not in tried]
        if not untried:
            return self.inner.sample_relative(study, trial, search_space)
        proposal: dict[str, Any] = {}
        for _ in range(self.tries):
            proposal = self.inner.sample_relative(study, trial, search_space)
            if not proposal:  # random search, or TPE before its model starts
                break
            if self._key([proposal[name] for name in self.names]) not in tried:
                return proposal
        if proposal:
            wanted = tuple(proposal[name] for name in self.names)
            changed = [sum(a != b for a, b in zip(point, wanted)) for point in untried]
            untried = [point for point, n in zip(untried, changed) if n == min(changed)]
        return dict(zip(self.names, self._rng.choice(untried)))

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        """The inner sampler's value for a parameter outside the listed space."""
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        """Passed to the inner sampler."""
        self.inner.before_trial(study, trial)

    def after_trial(
        self, study: Study, trial: FrozenTrial, state: TrialState, values: Optional[Sequence[float]]
    ) -> None:
        """Passed to the inner sampler."""
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Reseed this sampler and the inner one."""
        self._rng.seed()
        self.inner.reseed_rng()


def _untried_first(inner: BaseSampler, space: SearchSpace, seed: Optional[int]) -> BaseSampler:
    """`inner` wrapped in UntriedFirst when the space is finite and small enough to list."""
    try:
        grid = space.grid()
    except ValueError:  # a continuous parameter: points do not repeat
        return inner
    if not grid or math.prod(len(values) for values in grid.values()) > MAX_LISTED_POINTS:
        return inner
    return UntriedFirst(inner, space, grid, seed)


def make_sampler(
    name: str, seed: Optional[int], n_startup_trials: int, space: SearchSpace, n_objectives: int
) -> BaseSampler:
    """The configured sampler; every one but cmaes handles several objectives. TPE and random search
    propose untried points first on a finite space (`UntriedFirst`)."""
    if name == "tpe":
        return _untried_first(TPESampler(seed=seed, n_startup_trials=n_startup_trials), space, seed)
    if name == "random":
        return _untried_first(RandomSampler(seed=seed), space, seed)
    if name == "grid":
        return AskTellGridSampler(space.grid(), seed=seed)
    if name == "cmaes":
        if n_objectives > 1:
            raise ValueError("hydra.sweeper.sampler.name=cmaes optimises one objective; use tpe, random or grid")
        try:
            import cmaes  # noqa: F401  (CmaEsSampler imports it only when it first samples)
        except ImportError as e:
            raise ImportError(
                "hydra.sweeper.sampler.name=cmaes needs the `cmaes` package of the [search] extra: "
                "pip install 'scaling[search]'"
            ) from e
        # CMA-ES ignores constraints: it sees an infeasible trial only through its worst value.
        return CmaEsSampler(seed=seed, n_startup_trials=n_startup_trials, warn_independent_sampling=False)
    raise ValueError(f"hydra.sweeper.sampler.name={name!r} is not a sampler: use one of {', '.join(SAMPLERS)}")


def resumed_seed(seed: Optional[int], n_held: int) -> Optional[int]:
    """The sampler seed offset by the trials the study already holds, so a resumed run does not
    replay the proposals of the run before it."""
    return None if seed is None else seed + n_held


def open_study(
    storage: BaseStorage | str, study_name: str, directions: Sequence[str], metric_names: Sequence[str]
) -> Study:
    """Create the study or load it for a resume; directions must match the stored study's."""
    study = optuna.create_study(
        storage=storage, study_name=study_name, directions=list(directions), load_if_exists=True
    )
    stored = [d.name.lower() for d in study.directions]
    if stored != list(directions):
        raise ValueError(
            f"study {study_name!r} was created with directions={stored}, not {list(directions)}: "
            "pick another hydra.sweeper.study_name or sweep directory"
        )
    with warnings.catch_warnings():
        # Experimental since Optuna 3.2 but the way optuna-dashboard names objectives.
        warnings.simplefilter("ignore", ExperimentalWarning)
        study.set_metric_names(list(metric_names))
    return study


def recover_stale(study: Study) -> int:
    """Mark trials left RUNNING by a dead driver FAIL (`stale`) and enqueue their parameters again."""
    stale = study.get_trials(deepcopy=False, states=[TrialState.RUNNING])
    for trial in stale:
        study._storage.set_trial_user_attr(trial._trial_id, "stale", True)
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        if trial.params:  # a trial killed before its parameters were sampled has nothing to retry
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
    if stale:
        numbers = [t.number for t in stale]
        log.warning("retrying %d trial(s) left running by an interrupted sweep: %s", len(stale), numbers)
    return len(stale)


def counted_trials(study: Study) -> list[FrozenTrial]:
    """Finished trials that count towards n_trials (stale ones do not), in trial order."""
    trials = study.get_trials(deepcopy=False, states=[TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED])
    return [t for t in trials if not t.user_attrs.get("stale")]


def failure_rate(trials: Sequence[FrozenTrial]) -> float:
    """Fraction of counted trials that failed."""
    if not trials:
        return 0.0
    return sum(t.state == TrialState.FAIL for t in trials) / len(trials)


def noise_band(trial: FrozenTrial, objective: str, fixed: Optional[float]) -> float:
    """A trial's band for the patience rule: `fixed` (hydra.sweeper.noise_band) when set, else the band its
    record measured (metrics.noise_band_frac) when the objective moves with the step time, else 0."""
    if fixed is not None:
        return fixed
    if objective.rsplit(".", 1)[-1] not in THROUGHPUT_KEYS:
        return 0.0
    return float(trial.user_attrs.get("metrics", {}).get(NOISE_BAND_KEY) or 0.0)


def trials_since_improvement(
    trials: Sequence[FrozenTrial],
    direction: StudyDirection,
    band_of: Callable[[FrozenTrial], float] = lambda trial: 0.0,
) -> int:
    """Counted trials after the last one that moved the best feasible value: better than the best and
    not within noise of it (`band_of` gives each trial's band; all of them if none did)."""
    best: Optional[FrozenTrial] = None
    since = 0
    maximize = direction == StudyDirection.MAXIMIZE
    for trial in trials:
        since += 1
        if not is_feasible(trial):
            continue
        value = trial.value
        assert value is not None
        if best is None or (
            (value > best.value if maximize else value < best.value)
            and not within_noise(value, band_of(trial), best.value, band_of(best))
        ):
            best, since = trial, 0
    return since
