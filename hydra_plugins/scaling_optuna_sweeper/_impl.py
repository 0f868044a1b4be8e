"""The search loop: ask a batch of trials, answer what is already known, launch the rest, tell.

A trial whose parameters match an earlier complete trial, or whose point the record store already answers, starts no
job; the rest go to the Hydra launcher in one batch, `hydra.job.num` of each its trial number. The loop stops at
`n_trials` counted trials, after `patience` trials without a better feasible value beyond the noise band, or when
the grid sampler has visited every point; after every batch it rewrites `best.yaml` and `trials.csv`, and raises
once the failure rate exceeds `max_failure_rate`. docs/search.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_method
from omegaconf import DictConfig, ListConfig, OmegaConf
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import Trial, TrialState

from hydra_plugins.scaling_grid_sweeper._loader import ComposedConfigLoader
from scaling.core.schema import EXPERIMENT_GROUPS, ExperimentConfig, LaunchConfig
from scaling.core.validate import InvalidConfig, validate
from scaling.model.family import family_of
from scaling.store.read import RecordError, read_record
from scaling.store.record import answers, job_key, output_dir
from scaling.sweep.grid import save_multirun
from scaling.sweep.hydra_adapter import BasicLauncher

from . import _report
from ._outcome import Outcome, failure, judge, repeat_outcome, tell, worst_values
from ._space import SearchSpace, format_value, leaf_overrides, parse_search_space
from ._study import (
    DIRECTIONS,
    AskTellGridSampler,
    counted_trials,
    failure_rate,
    make_sampler,
    make_storage,
    noise_band,
    open_study,
    recover_stale,
    resumed_seed,
    trials_since_improvement,
)
from .config import DEFAULT_OBJECTIVE

log = logging.getLogger(__name__)


@dataclass
class ExperimentPoint:
    """A trial's point in the engine's terms."""

    run_overrides: list[str]
    """Every experiment field plus sweep and sweep_dir: `python -m scaling run <these>` runs the point."""
    record: Optional[dict[str, Any]]
    """Its record in the store, when the store answers it without running (see launch.rerun)."""
    repeats: int
    """launch.repeats: the ok launches an earlier measurement needs to answer the point."""


class OptunaSearch(Sweeper):
    """Ask/tell driver of one study; `sweeper.ScalingOptunaSweeper` delegates to it."""

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
        params: Optional[Mapping[str, str]],
        dry_run: bool = False,
    ) -> None:
        objectives, directions = resolve_objectives(objectives, directions, direction)
        _check_settings(objectives, directions, n_trials, n_jobs, patience, noise_band, max_failure_rate)
        self.objectives = objectives
        self.directions = directions
        self.sampler_conf = sampler
        """Our SamplerConf (name, seed, n_startup_trials), or the sampler Hydra built from a `_target_`."""
        self.extend_space: Optional[Callable[[DictConfig, Trial], None]] = (
            get_method(custom_search_space) if custom_search_space else None
        )
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.patience = patience
        self.noise_band = noise_band
        self.max_failure_rate = max_failure_rate
        self.study_name = study_name
        self.storage = storage
        self.params = dict(params or {})
        self.dry_run = dry_run
        self.hydra_context: Optional[HydraContext] = None
        self.config: Optional[DictConfig] = None
        self.launcher: Any = None
        self.composed: dict[tuple[str, ...], DictConfig] = {}
        """The configs of the batch's trials, composed by `_experiment_point`, by their overrides: what Hydra's
        basic launcher would compose for them again."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep the context and instantiate the configured launcher; Hydra's basic launcher (jobs in this process)
        takes each trial's config as `_experiment_point` composed it instead of composing it again."""
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        if type(self.launcher) is BasicLauncher:
            loader = ComposedConfigLoader(
                hydra_context.config_loader, config, lambda overrides: self.composed.pop(tuple(overrides), None)
            )
            self.launcher.setup(
                hydra_context=replace(hydra_context, config_loader=loader), task_function=task_function, config=config
            )

    def sweep(self, arguments: List[str]) -> Optional[dict[str, Any]]:
        """Search until a stop condition holds; returns the `best` entry of best.yaml."""
        assert self.config is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        space = parse_search_space([f"{k}={v}" for k, v in self.params.items()] + list(arguments), parser)
        if not space.distributions:
            raise HydraException("hydra.sweeper.params holds no sweep (choice, range, interval or a comma list)")
        self._check_space(space)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        if self.dry_run:
            where = self.storage or sweep_dir / "optuna.journal"
            print(
                f"Dry run: study {self._study_name(sweep_dir)!r} in {where}, up to {self.n_trials} trials of "
                + ", ".join(f"{name} in {_values(dist)}" for name, dist in space.distributions.items())
                + f", objective {', '.join(f'{o} ({d})' for o, d in zip(self.objectives, self.directions))}"
                + "; nothing launched"
            )
            return None
        sweep_dir.mkdir(parents=True, exist_ok=True)
        save_multirun(self.config)

        storage = make_storage(self.storage, sweep_dir)
        storage_name = self.storage or str(sweep_dir / "optuna.journal")
        study = open_study(storage, self._study_name(sweep_dir), self.directions, self.objectives)
        recover_stale(study)
        searched = list(dict.fromkeys(name for t in study.get_trials(deepcopy=False) for name in t.params))
        if searched and set(searched) != set(space.distributions):
            log.warning(
                "Study %r's trials so far searched %s; this run searches %s: the sampler weighs both in one study "
                "(hydra.sweeper.study_name=<another name> starts one of its own)",
                study.study_name,
                searched,
                list(space.distributions),
            )
        if isinstance(self.sampler_conf, BaseSampler):  # built by Hydra from hydra/sweeper/sampler's _target_
            study.sampler = self.sampler_conf
        else:
            seed = resumed_seed(self.sampler_conf.seed, len(study.trials))
            study.sampler = make_sampler(
                self.sampler_conf.name, seed, self.sampler_conf.n_startup_trials, space, len(self.objectives)
            )
        log.info(
            "Study %r in %s: %d trial(s) held, searching %s with %s",
            study.study_name,
            storage_name,
            len(study.trials),
            list(space.distributions),
            type(study.sampler).__name__,
        )

        while (reason := self._stop_reason(study)) is None:
            batch = [study.ask(space.distributions) for _ in range(self._batch_size(study))]
            self._run_batch(study, space, batch)
            _report.write_best(sweep_dir, study, self.objectives, storage_name)
            _report.write_trials(sweep_dir, _report.trial_rows(study, self.objectives))
            self._check_failures(study)
        log.info("Search stopped: %s", reason)

        table = _report.write_trials(sweep_dir, _report.trial_rows(study, self.objectives))
        best = _report.write_best(sweep_dir, study, self.objectives, storage_name)
        log.info("Trials of study %r:\n%s", study.study_name, table)
        if best is None:
            log.warning("No feasible trial: %s names none", sweep_dir / _report.BEST_FILE)
        else:
            log.info("Best (trial %d): %s -> %s", best["trial"], " ".join(best["overrides"]), best["values"])
        return best

    def _check_space(self, space: SearchSpace) -> None:
        """Each value of the search space (every choice; a range's ends), alone over the fixed overrides, composed
        and, of a task with the record store's fields, validated: a key that names no field, a value of the wrong
        type and a value no point can take (`parallel.zero_stage=4`) are refused here, naming it and what is valid,
        before the study is opened or any trial runs, the dry run's included. What only a combination of values
        makes invalid (an mbs the batch does not divide at some dp) stays that trial's `invalid` outcome."""
        assert self.hydra_context is not None and self.config is not None
        refused: list[str] = []
        for name, dist in space.distributions.items():
            for value in dict.fromkeys(dist.choices if hasattr(dist, "choices") else (dist.low, dist.high)):
                said = f"{name}={format_value(value)}"
                cfg = self.hydra_context.config_loader.load_sweep_config(  # raises on an unknown key or a bad type
                    master_config=self.config, sweep_overrides=[*space.fixed, said]
                )
                experiment = _experiment(cfg)
                if experiment is None:
                    return  # another task's config: its own checks are its trials'
                try:
                    validate(ExperimentConfig.from_dict(experiment), host=False)
                except InvalidConfig as e:  # the value's own faults, not those of its combination with the base
                    refused += [m for m in e.alone if m.startswith(f"{name}=")]
                except ValueError:
                    pass  # what the trial composing it will say
        if refused:
            raise HydraException(f"hydra.sweeper.params: {'; '.join(dict.fromkeys(refused))}")

    def _study_name(self, sweep_dir: Path) -> str:
        if self.study_name:
            return self.study_name
        assert self.config is not None
        return str(self.config.get("sweep") or sweep_dir.name)

    def _stop_reason(self, study: Study) -> Optional[str]:
        counted = counted_trials(study)
        if len(counted) >= self.n_trials:
            return f"{len(counted)} trials reached n_trials={self.n_trials}"
        if self.patience is not None:
            since = trials_since_improvement(
                counted, study.direction, partial(noise_band, objective=self.objectives[0], fixed=self.noise_band)
            )
            if since >= self.patience:
                band = "measured" if self.noise_band is None else f"{self.noise_band:g}"
                return (
                    f"{since} trials without a better feasible value (patience={self.patience}); "
                    f"one within the noise band of the best does not count (hydra.sweeper.noise_band={band})"
                )
        if isinstance(study.sampler, AskTellGridSampler) and self._batch_size(study) == 0:
            return "the grid sampler visited every point"
        return None

    def _batch_size(self, study: Study) -> int:
        size = min(self.n_jobs, self.n_trials - len(counted_trials(study)))
        if isinstance(study.sampler, AskTellGridSampler):
            # Enqueued retries take no grid point, so they do not count against the points left.
            waiting = len(study.get_trials(deepcopy=False, states=[TrialState.WAITING]))
            size = min(size, waiting + study.sampler.points_left(study))
        return size

    def _run_batch(self, study: Study, space: SearchSpace, batch: Sequence[Trial]) -> None:
        """Answer known points, launch the others, tell every trial of the batch."""
        outcomes: dict[int, Outcome] = {}
        to_launch: list[tuple[Trial, list[str]]] = []
        worst = worst_values(study.get_trials(deepcopy=False, states=[TrialState.COMPLETE]), study.directions)
        for trial in batch:
            if self.extend_space is not None:  # hydra-optuna-sweeper's custom_search_space: more suggest_* calls
                self.extend_space(self.config, trial)
            overrides = space.overrides(trial.params)
            trial.set_user_attr("overrides", overrides)
            point = self._experiment_point(overrides)
            if point is not None:
                trial.set_user_attr("run_overrides", point.run_overrides)
            known = self._known_outcome(study, trial, point, worst)
            if known is not None:
                outcomes[trial.number] = known
            else:
                to_launch.append((trial, overrides))
        # Every trial's overrides were composed by `_experiment_point` above, which raised on any that cannot be
        # (what Hydra's `validate_batch_is_legal` would compose them again for).
        for run in _consecutive_runs(to_launch):
            returns = self.launcher.launch([overrides for _, overrides in run], initial_job_idx=run[0][0].number)
            for (trial, _), ret in zip(run, returns):
                outcomes[trial.number] = self._judge_return(ret, worst)
        self.composed.clear()  # of trials answered without a launch
        for trial in batch:
            tell(study, trial, outcomes[trial.number])

    def _judge_return(self, ret: JobReturn, worst: list[float]) -> Outcome:
        try:
            record = ret.return_value  # re-raises what the job raised
        except Exception as e:
            return failure(f"{type(e).__name__}: {e}")
        return judge(record, self.objectives, worst)

    def _known_outcome(
        self, study: Study, trial: Trial, point: Optional[ExperimentPoint], worst: list[float]
    ) -> Optional[Outcome]:
        """The outcome of a point measured before: an equal COMPLETE trial, or a stored record."""
        repeat = repeat_outcome(
            study.get_trials(deepcopy=False, states=[TrialState.COMPLETE]),
            trial.params,
            point.repeats if point is not None else 1,
        )
        if repeat is not None:
            return repeat
        if point is None or point.record is None:
            return None
        outcome = judge(point.record, self.objectives, worst)
        outcome.attrs["answered_from"] = "record store"
        return outcome

    def _experiment_point(self, overrides: list[str]) -> Optional[ExperimentPoint]:
        """What a trial's overrides compose to, for a task whose config has the record store's
        fields (model, train, parallel, hardware, sweep, sweep_dir); None for any other task."""
        assert self.hydra_context is not None and self.config is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(master_config=self.config, sweep_overrides=overrides)
        self.composed[tuple(overrides)] = cfg
        experiment = _experiment(cfg)
        if experiment is None or not all(key in cfg for key in ("sweep", "sweep_dir")):
            return None
        sweep_dir = output_dir(cfg.sweep_dir, cfg.hydra)
        # The whole experiment, so the point runs the same from the default primary config too; the model first by
        # its file (a model of one's own has fields that are not the built-in family's, which the default's has).
        choice = OmegaConf.select(cfg, "hydra.runtime.choices.model", default=None)
        model = [f"model={choice}"] if choice else []
        run_overrides = model + leaf_overrides({**experiment, "sweep": cfg.sweep, "sweep_dir": sweep_dir})
        point = ExperimentConfig.from_dict(experiment)
        key = job_key(point)
        try:
            record = read_record(sweep_dir, key, set_aside_corrupt=True)
        except RecordError as e:  # run_point will not run it either: the trial fails with the reason
            print(f"[scaling] {e}", flush=True)
            record = None
        launch = LaunchConfig(
            rerun=OmegaConf.select(cfg, "launch.rerun", default="none"),
            repeats=OmegaConf.select(cfg, "launch.repeats", default=1),
            prescreen_sample=OmegaConf.select(cfg, "launch.prescreen_sample", default=0.0),
        )
        code = family_of(point.model).code() if record is not None else None  # an edited model's failure runs again
        return ExperimentPoint(run_overrides, record if answers(record, key, launch, code) else None, launch.repeats)

    def _check_failures(self, study: Study) -> None:
        counted = counted_trials(study)
        rate = failure_rate(counted)
        if rate > self.max_failure_rate:
            failed = [t.number for t in counted if t.state == TrialState.FAIL]
            raise HydraException(
                f"{len(failed)} of {len(counted)} trials failed ({rate:.0%}), above "
                f"hydra.sweeper.max_failure_rate={self.max_failure_rate}; failed trials: {failed} "
                "(their errors are in trials.csv)"
            )


def _experiment(cfg: DictConfig) -> Optional[dict[str, Any]]:
    """The experiment groups of a composed config, resolved (what ExperimentConfig.from_dict reads); None for a task
    whose config lacks them."""
    if not all(group in cfg for group in EXPERIMENT_GROUPS):
        return None
    return {group: OmegaConf.to_container(cfg[group], resolve=True) for group in EXPERIMENT_GROUPS}


def _consecutive_runs(items: list[tuple[Trial, list[str]]]) -> list[list[tuple[Trial, list[str]]]]:
    """Split trials into runs of consecutive numbers, so each job's hydra.job.num is its trial number."""
    runs: list[list[tuple[Trial, list[str]]]] = []
    for item in items:
        if runs and runs[-1][-1][0].number + 1 == item[0].number:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def resolve_objectives(
    objectives: Sequence[str], directions: Optional[Sequence[str]], direction: Optional[Any]
) -> tuple[list[str], list[str]]:
    """The objectives and their directions from `directions` or hydra-optuna-sweeper's `direction` (one
    or a list); several directions with the default objective name the values value_0, value_1, ..."""
    if direction is not None:
        given = [str(d) for d in direction] if isinstance(direction, (list, tuple, ListConfig)) else [str(direction)]
        if directions is not None and list(directions) != given:
            raise ValueError(
                f"hydra.sweeper.direction={given} and hydra.sweeper.directions={list(directions)} "
                "disagree: set one of them"
            )
        directions = given
    directions = list(directions) if directions is not None else ["maximize"]
    objectives = list(objectives)
    if objectives == [DEFAULT_OBJECTIVE] and len(directions) > 1:
        objectives = [f"value_{i}" for i in range(len(directions))]
    return objectives, directions


def _check_settings(
    objectives: Sequence[str],
    directions: Sequence[str],
    n_trials: int,
    n_jobs: int,
    patience: Optional[int],
    noise_band: Optional[float],
    max_failure_rate: float,
) -> None:
    if not objectives:
        raise ValueError(
            "hydra.sweeper.objectives is empty: name at least one record field, e.g. metrics.tokens_per_s_per_gpu"
        )
    if len(directions) != len(objectives):
        raise ValueError(
            f"hydra.sweeper.directions={list(directions)} must give one direction per objective {list(objectives)}"
        )
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad:
        raise ValueError(f"hydra.sweeper.directions={list(directions)}: {bad} not in {DIRECTIONS}")
    if n_trials < 1:
        raise ValueError(f"hydra.sweeper.n_trials={n_trials} must be >= 1")
    if n_jobs < 1:
        raise ValueError(f"hydra.sweeper.n_jobs={n_jobs} must be >= 1")
    if patience is not None and (patience < 1 or len(objectives) > 1):
        raise ValueError(f"hydra.sweeper.patience={patience} needs a single objective and a value >= 1")
    if noise_band is not None and not 0.0 <= noise_band < 1.0:
        raise ValueError(
            f"hydra.sweeper.noise_band={noise_band} must be a fraction in [0, 1), or null for the "
            "measured band of each trial"
        )
    if not 0.0 <= max_failure_rate <= 1.0:
        raise ValueError(f"hydra.sweeper.max_failure_rate={max_failure_rate} must be in [0, 1]")


def _values(dist: Any) -> str:
    """A distribution's values in words: `{1, 2, 4}` or `[low, high]` (log-scaled or stepped when so)."""
    if hasattr(dist, "choices"):
        return "{" + ", ".join(map(str, dist.choices)) + "}"
    scale = " log" if getattr(dist, "log", False) else ""
    step = f" step {dist.step}" if getattr(dist, "step", None) not in (None, 1) else ""
    return f"[{dist.low}, {dist.high}]{scale}{step}"
