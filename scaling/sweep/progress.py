"""Sweep bookkeeping as a Hydra callback: the sweep.json index, a progress line per point in the terminal that
started the sweep, and the closing line with the count of points in each status.

Registered in conf/config.yaml (hydra.callbacks), so `scaling run -m` and `scaling sweep NAME` behave the same. The
driver's `Progress` numbers the points as they end, each once, whoever learns of it first: the callback (a job in
the driver's process), the SLURM launcher or the sweeper (reached through the Hydra context: `driver_progress`).
The closing counts are read from the store; a point the driver left unrun (its record unreadable, its devices or
its claim not had by the deadline) is no record, and the closing lines name it (`not_run`). The outcome leaves as
data (`outcome_file`, `PointsFailed`), which the `scaling` command alone turns into its exit status.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from scaling.core.enums import Status
from scaling.core.files import read_json, unwritable, write_json_atomic
from scaling.core.units import format_bytes
from scaling.store import inflight
from scaling.store.index import update_index
from scaling.store.read import iter_records
from scaling.store.record import NOT_RUN
from scaling.sweep.grid import expand, status_list


class PointsFailed(Exception):
    """Some points of a sweep failed or timed out (raised after every point ran and was recorded), or were not run."""

    def __init__(self, counts: Counter, not_run: Optional[Mapping[str, str]] = None) -> None:
        self.counts, self.not_run = counts, dict(not_run or {})
        bad = [f"{counts[s]} {s}" for s in (Status.TIMEOUT, Status.FAILED) if counts[s]]
        total = sum(counts.values()) + len(self.not_run)
        if self.not_run:
            super().__init__(
                f"{', '.join([*bad, f'{len(self.not_run)} not run'])} of {total} points (the points not run are "
                "named above, each with why; a re-run runs them)"
            )
        else:
            super().__init__(f"{', '.join(bad)} of {total} points (every point ran; each record has its error)")


@dataclass
class Outcome:
    """How a run of the command ended: points per status among the records, and the points it did not run."""

    counts: Counter
    not_run: dict[str, str] = field(default_factory=dict)
    """Job key: why, for each point left unrun (nothing recorded)."""


def count_grid(config: DictConfig) -> Optional[int]:
    """Points in a grid multirun (the grid's expansion, scaling.sweep.grid.expand), or the trial budget of a
    search; None if unknown."""
    sweeper = config.hydra.sweeper
    if "n_trials" in sweeper:
        return int(sweeper.n_trials)
    return len(expand(sweeper.get("params") or {}, list(config.hydra.overrides.task)))


def progress_line(k: int, total: Optional[int], record: dict[str, Any]) -> str:
    """`[k/N] key status tokens/s/GPU peak` for one finished point."""
    m = record.get("metrics") or {}
    tps = f"{m['tokens_per_s_per_gpu']:.1f}" if m.get("tokens_per_s_per_gpu") is not None else "-"
    peak = m.get("peak_mem_bytes") or (record.get("predicted") or {}).get("peak_mem_bytes")
    return (
        f"[{k}/{total if total is not None else '?'}] {record['job_key']} {record['status']} {tps} {format_bytes(peak)}"
    )


def status_counts(sweep_dir: str | Path) -> Counter:
    """Points per status among the records of a sweep directory."""
    return Counter(r.get("status") for r in iter_records(sweep_dir))


def closing_line(
    name: str, sweep_dir: str | Path, counts: Counter, in_flight: int = 0, not_run: Optional[Mapping[str, str]] = None
) -> str:
    """The sweep's last line: how many points ended in each status, how many were not run (each then named on a
    line of its own) and how many other jobs still hold."""
    not_run = not_run or {}
    held = f"; {in_flight} still in flight (scaling status {sweep_dir})" if in_flight else ""
    unrun = f", {len(not_run)} not run" if not_run else ""
    total = sum(counts.values()) + len(not_run)
    lines = [f"sweep {name}: {total} points: {status_list(counts) or 'none recorded'}{unrun} ({sweep_dir}){held}"]
    return "\n".join(lines + [f"  not run {key}: {why}" for key, why in sorted(not_run.items())])


def has_failures(outcome: Outcome) -> bool:
    """A sweep with crashed or timed-out points, or points not run, exits non-zero (after finishing every point)."""
    return outcome.counts[Status.FAILED] + outcome.counts[Status.TIMEOUT] > 0 or bool(outcome.not_run)


def raise_for_failures(outcome: Optional[Outcome]) -> None:
    """Raise `PointsFailed` when points failed, timed out or were not run; None (nothing ran) passes."""
    if outcome is not None and has_failures(outcome):
        raise PointsFailed(outcome.counts, outcome.not_run)


def read_outcome(path: str | Path) -> Optional[Outcome]:
    """The outcome a `SweepProgress` wrote to its outcome file; None if it wrote none."""
    outcome = read_json(path)
    return None if outcome is None else Outcome(Counter(outcome["counts"]), outcome.get("not_run") or {})


class Progress:
    """The driver's view of one multirun: numbers and prints each point once as it ends."""

    def __init__(
        self, total: Optional[int], sweep_dir: Optional[Path], run: int = -1, read_only: Optional[str] = None
    ) -> None:
        self.total = total
        self.sweep_dir = sweep_dir
        """The store whose sweep.json lists this run (None: not recorded there)."""
        self.read_only = read_only
        """Why the store cannot be written (None: it can): the run then answers from it, and runs nothing."""
        self.run = run
        """This run's entry in sweep.json's `runs` (another driver may have added one after it)."""
        self.done = 0
        self.in_flight = 0
        self.not_run: dict[str, str] = {}
        """Job key: why, for each point this run left unrun (`left_unrun`)."""
        self._reported: set[int] = set()
        self._points: dict[int, Path] = {}
        """Job directory of each job number the grid sweeper launches (for the SLURM launcher's markers)."""

    def _k(self) -> str:
        return f"[{self.done}/{self.total if self.total is not None else '?'}]"

    def record_grid(self, job_keys: Sequence[str], rerun: str, repeats: int = 1, prescreen_sample: float = 0.0) -> None:
        """Add the grid's job keys, launch.rerun, launch.repeats and launch.prescreen_sample to this run's entry
        of sweep.json (for `scaling status`, which judges a point done by the rule run_point follows,
        scaling.store.record.answers)."""
        if self.sweep_dir is None:
            return

        def add_grid(index: dict[str, Any]) -> None:
            index["runs"][self.run].update(
                points=len(job_keys),
                rerun=rerun,
                repeats=repeats,
                prescreen_sample=prescreen_sample,
                job_keys=list(job_keys),
            )

        update_index(self.sweep_dir, add_grid)

    def answered(self, counts: Counter) -> None:
        """Points the record store answers: they count as done, in one line."""
        n = sum(counts.values())
        if n:
            self.done += n
            print(f"{self._k()} {n} points already recorded ({status_list(counts)}): not launched again", flush=True)

    def held_elsewhere(self, holders: Sequence[str]) -> None:
        """Points a live job holds (another driver's process, a queued or running SLURM task): not launched."""
        if holders:
            self.in_flight = len(holders)
            shown = ", ".join(holders[:5]) + (", ..." if len(holders) > 5 else "")
            print(
                f"{self._k()} {len(holders)} points in flight in other jobs ({shown}): not launched again", flush=True
            )

    def left_unrun(self, key: str, why: str) -> None:
        """A point this run does not run and records nothing of: it counts as not run, named with why."""
        self.done += 1
        self.not_run[key] = why
        print(f"{self._k()} {key} not run: {why}", flush=True)

    def expect(self, num: int, point_dir: Path) -> None:
        """Job number `num` of this run is the point of job directory `point_dir`."""
        self._points[num] = point_dir

    def submitted(self, num: int, slurm_job_id: str) -> None:
        """SLURM job `slurm_job_id` holds job number `num`: mark its point queued, so a re-run leaves it alone."""
        if num in self._points:
            inflight.mark_queued(self._points[num], slurm_job_id)

    def ended(self, num: int, job_return: JobReturn) -> None:
        """Print job number `num`'s line, the first time its end is reported."""
        if num in self._reported:
            return
        self._reported.add(num)
        self._points.pop(num, None)
        value = job_return.return_value if job_return.status == JobStatus.COMPLETED else None
        if isinstance(value, dict) and value.get(NOT_RUN):
            self.left_unrun(value["job_key"], value[NOT_RUN])
            return
        self.done += 1
        if isinstance(value, dict):
            print(progress_line(self.done, self.total, value), flush=True)
        else:
            print(f"{self._k()} job {num} raised: {job_return._return_value!r}", flush=True)


def dry_run(config: DictConfig) -> bool:
    """Whether the multirun only prints its forecast (hydra.sweeper.dry_run=true)."""
    return bool(OmegaConf.select(config, "hydra.sweeper.dry_run", default=False))


def driver_progress(hydra_context: Any) -> Optional[Progress]:
    """The Progress of the multirun this driver runs, from its Hydra context (None without the callback)."""
    for callback in hydra_context.callbacks.callbacks:
        if isinstance(callback, SweepProgress):
            return callback.progress
    return None


class SweepProgress(Callback):
    """Writes sweep.json and opens the driver's Progress, reports jobs that end in the driver's process, and
    prints the counts at the end; with `outcome_file`, also writes the counts there (JSON) for the command
    that started Hydra."""

    def __init__(self, outcome_file: Optional[str] = None) -> None:
        self.outcome_file = outcome_file
        self.multirun = False
        self.progress: Optional[Progress] = None

    def __getstate__(self) -> dict[str, Any]:
        """The copy a launcher ships to a job's process leaves the driver's Progress behind."""
        return {**self.__dict__, "progress": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.multirun = True
        if dry_run(config):
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        total = count_grid(config)
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")

        def add_run(index: dict[str, Any]) -> int:
            if not index:
                index.update(name=config.sweep, created_at=now, runs=[])  # update_index adds the store's id
            index["hardware"] = OmegaConf.to_container(config.hardware, resolve=True)
            index["runs"].append(
                {
                    "started_at": now,
                    "grid": {str(k): str(v) for k, v in (config.hydra.sweeper.get("params") or {}).items()},
                    "overrides": list(config.hydra.overrides.task),
                    "sweeper": config.hydra.sweeper._target_,
                    "launcher": config.hydra.launcher._target_,
                    "points": total,
                }
            )
            return len(index["runs"]) - 1

        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            self.progress = Progress(total, sweep_dir, update_index(sweep_dir, add_run))
        except OSError as e:
            stop = unwritable(e, sweep_dir)
            if stop is None:
                raise
            if stop.no_space:
                raise stop from e
            self.progress = Progress(total, None, read_only=str(stop))  # it may answer every point from the store

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self.progress is not None:  # a job of the multirun, run in the driver's own process
            self.progress.ended(config.hydra.job.num, job_return)
        elif (  # a single run prints its own summary line
            not self.multirun and job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, dict)
        ):
            value = job_return.return_value
            if value.get(NOT_RUN):
                self._write_outcome(Outcome(Counter(), {value["job_key"]: value[NOT_RUN]}))
            else:
                self._write_outcome(Outcome(Counter([value.get("status")])))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if dry_run(config):
            return
        tracker, self.progress = self.progress, None
        in_flight, not_run = (tracker.in_flight, tracker.not_run) if tracker is not None else (0, {})
        counts = status_counts(config.hydra.sweep.dir)
        print(closing_line(config.sweep, config.hydra.sweep.dir, counts, in_flight, not_run), flush=True)
        self._write_outcome(Outcome(counts, not_run))

    def _write_outcome(self, outcome: Outcome) -> None:
        if self.outcome_file:
            write_json_atomic(Path(self.outcome_file), {"counts": dict(outcome.counts), "not_run": outcome.not_run})
