"""The grid sweep: expand the grid, answer recorded points from the store, launch the rest.

Each point's config and job key come from `scaling.sweep.grid` (one Hydra composition per config-group
choice, not per point), so a fully recorded grid of 10,000 points resumes in seconds instead of
making 10,000 Hydra jobs that each find their record. A point a live job still holds (its running
marker names a queued or running SLURM task, or a live process: see `scaling.store.inflight`) is not
launched again. The points left go to the Hydra launcher, in one batch or in batches of
`max_batch_size`; Hydra's basic launcher composes each job from the compositions the survey made (`_loader`), not
anew; the driver's `scaling.sweep.progress.Progress` counts the answered ones and prints
each launched one as it ends. With `dry_run` it prints the forecast and launches nothing.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, List, Mapping, Optional

from hydra.core.utils import JobReturn
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from scaling.core.files import StoreUnwritable, stop_when_unwritable
from scaling.store import inflight
from scaling.store.record import job_dir
from scaling.sweep import progress
from scaling.sweep.grid import (
    Forecast,
    PointConfigs,
    expand,
    points_at_once,
    predict_new,
    save_multirun,
    survey,
)
from scaling.sweep.hydra_adapter import BasicLauncher, BasicSweeper

from ._loader import ComposedConfigLoader

log = logging.getLogger(__name__)


@dataclass
class _ToRun:
    """A point the store does not answer: what the launcher needs, and where its record goes."""

    num: int
    overrides: list[str]
    jd: Path


@dataclass
class _Plan:
    """What this run of the grid does with each point."""

    keys: list[str] = field(default_factory=list)
    """Every point's job key, in grid order."""
    answered: Counter = field(default_factory=Counter)
    """Statuses of the points the store answers."""
    to_run: list[_ToRun] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    """Who holds each point a live job still runs (not launched again)."""
    stalled: list[str] = field(default_factory=list)
    """Who holds each point a live job holds but has stalled: run last, its claim waited for at most
    launch.stalled_wait_s (scaling.store.inflight.claim)."""
    forecast: Forecast = field(default_factory=Forecast)
    unreadable: dict[str, str] = field(default_factory=dict)
    """Points whose record cannot be read, by job key: not run, the file left as it is."""


def _holder(marker: Mapping[str, Any]) -> str:
    """Who holds an in-flight point, in words."""
    if marker.get("slurm_job_id"):
        return f"SLURM job {marker['slurm_job_id']}"
    return f"pid {marker.get('pid')} on {marker.get('host')}"


class GridSweep(BasicSweeper):
    """Hydra's basic sweeper (its params, setup and batches), answering the store before it launches."""

    def __init__(
        self,
        max_batch_size: Optional[int],
        dry_run: bool,
        params: Optional[Mapping[str, str]],
        compose_once: bool = True,
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"hydra.sweeper.max_batch_size={max_batch_size} must be >= 1 or null (one batch)")
        super().__init__(max_batch_size=max_batch_size, params=dict(params or {}))
        self.dry_run = dry_run
        self.compose_once = compose_once
        self.configs: Optional[PointConfigs] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Hydra's setup; Hydra's basic launcher (jobs in this process) then composes each job from the
        compositions the grid's survey makes (`ComposedConfigLoader`), other launchers as Hydra does."""
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.configs = PointConfigs(hydra_context.config_loader, config)
        if self.compose_once and type(self.launcher) is BasicLauncher:
            loader = ComposedConfigLoader(self.configs.loader, self.configs.master, self.configs.job_config)
            composed = replace(hydra_context, config_loader=loader)
            self.launcher.setup(hydra_context=composed, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> list[list[JobReturn]]:
        """Answer, then launch, every point of the grid; returns the launched points' JobReturns per batch."""
        assert self.config is not None and self.hydra_context is not None and self.configs is not None
        points, configs = expand(self.params, arguments), self.configs
        plan = self._plan(points, configs)
        log.info(
            "Grid of %d points: %d Hydra compositions, %d answered by the store, %d held by live jobs, %d to run",
            len(points),
            configs.compositions,
            sum(plan.answered.values()),
            len(plan.held),
            len(plan.to_run),
        )
        if self.dry_run:
            for problem in plan.unreadable.values():
                print(f"[scaling] not run, its record cannot be read: {problem}", flush=True)
            lines = plan.forecast.lines(str(self.config.get("sweep", "grid")), points_at_once(self.config))
            print("\n".join(lines), flush=True)
            return []
        tracker = progress.driver_progress(self.hydra_context) or progress.Progress(len(points), None)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        with stop_when_unwritable(sweep_dir / ".hydra"):  # Hydra's own job files there name no path
            tracker.record_grid(
                plan.keys,
                str(OmegaConf.select(self.config, "launch.rerun", default="none")),
                int(OmegaConf.select(self.config, "launch.repeats", default=1)),
                float(OmegaConf.select(self.config, "launch.prescreen_sample", default=0.0)),
            )
            tracker.answered(plan.answered)
            tracker.held_elsewhere(plan.held)
            for key, problem in plan.unreadable.items():
                tracker.left_unrun(key, f"its record cannot be read: {problem}")
            if plan.stalled:
                n = len(plan.stalled)
                print(f"[scaling] {n} point{'s' * (n > 1)} held by stalled jobs, run last: {'; '.join(plan.stalled)}")
            if tracker.read_only is not None:  # the store answers what it holds, and nothing more can be recorded
                if plan.to_run:
                    left = f"{len(plan.to_run)} point{'s' if len(plan.to_run) > 1 else ''} still to run"
                    raise StoreUnwritable(f"{tracker.read_only}: {left}, not run", no_space=False)
                return []
            save_multirun(self.config)
            return self._launch(plan.to_run, tracker)

    def _plan(self, points: list[list[str]], configs: PointConfigs) -> _Plan:
        """Sort the grid's points into answered by the store, held by a live job, and to run."""
        plan, marked = _Plan(), []
        for point in survey(points, configs, set_aside=not self.dry_run):
            plan.keys.append(point.key)
            if point.problem is not None:
                plan.unreadable[point.key] = str(point.problem)
                continue
            new = predict_new(point.cfg) if self.dry_run and not point.done else {"status": None, "unscreened": None}
            verdict = new["status"]
            if point.done:
                plan.answered[point.record["status"]] += 1
                plan.forecast.add(point, verdict)
                continue
            item = _ToRun(point.num, point.overrides, job_dir(point.sweep_dir, point.key))
            marker = inflight.read_marker(item.jd)
            if marker is None:
                plan.to_run.append(item)
                plan.forecast.add(point, verdict, unscreened=new["unscreened"])
            else:  # decided below, with one squeue call for every marker that names a SLURM job
                marked.append((item, marker, point, new))
        markers = {item.jd.name: marker for item, marker, _, _ in marked}
        live, host = inflight.live_markers(markers, inflight.marker_states(markers)), socket.gethostname()
        last = []
        for item, marker, point, new in marked:
            held = bool(live[item.jd.name])
            how = inflight.stalled(marker, host) if held else None
            plan.forecast.add(point, new["status"], in_flight=held and not how, unscreened=new["unscreened"])
            if how:
                plan.stalled.append(f"{item.jd.name}: {_holder(marker)}, {how}")
                last.append(item)
            elif held:
                plan.held.append(_holder(marker))
            else:
                plan.to_run.append(item)
        plan.to_run.sort(key=lambda p: p.num)
        plan.to_run += sorted(last, key=lambda p: p.num)
        return plan

    def _launch(self, to_run: list[_ToRun], tracker: progress.Progress) -> list[list[JobReturn]]:
        returns = []
        size = self.max_batch_size or max(1, len(to_run))
        for start in range(0, len(to_run), size):
            batch = to_run[start : start + size]
            for i, point in enumerate(batch):
                tracker.expect(start + i, point.jd)
            results = self.launcher.launch([p.overrides for p in batch], initial_job_idx=start)
            for i, ret in enumerate(results):
                tracker.ended(start + i, ret)
            for ret in results:
                _ = ret.return_value  # re-raises what a job raised, after its batch, as Hydra's basic sweeper does
            returns.append(list(results))
        return returns
