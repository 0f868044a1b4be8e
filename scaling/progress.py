"""Sweep bookkeeping as a Hydra callback: the sweep.json index, a progress line per point, and the
closing line with the count of points in each status.

    [k/N] <job_key> <status> <tokens/s/GPU> <peak mem>
    sweep demo: 64 points: 40 ok, 12 oom, 10 predicted_oom, 2 invalid (runs/demo)

Registered in conf/config.yaml under hydra.callbacks, so plain `python -m scaling.run -m` and
`scaling sweep NAME` behave the same. The counts are read from the record store, so they cover
every point the sweep directory holds, including those answered by an earlier run.

The outcome leaves the callback as data, not as module state: given `outcome_file`, the callback
writes the closing counts there as JSON (a single run: its point's status), and `raise_for_failures`
turns counts with failed or timed-out points into `PointsFailed`, which the `scaling` command alone
turns into exit status 1.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from scaling.engine.jobfiles import read_json, write_json_atomic
from scaling.record import FAILED, STATUSES, SWEEP_INDEX, TIMEOUT, iter_records



class PointsFailed(Exception):
    """Some points of a sweep failed or timed out (raised after every point ran and was recorded)."""

    def __init__(self, counts: Counter) -> None:
        self.counts = counts
        bad = ", ".join(f"{counts[s]} {s}" for s in (TIMEOUT, FAILED) if counts[s])
        super().__init__(f"{bad} of {sum(counts.values())} points (every point ran; each record has its error)")


def count_grid(config: DictConfig) -> Optional[int]:
    """Points in a grid multirun (basic sweeper), or the trial budget of a search; None if unknown."""
    sweeper = config.hydra.sweeper
    if "n_trials" in sweeper:
        return int(sweeper.n_trials)
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
    return sum(len(batch) for batch in BasicSweeper.split_arguments(parsed, None))


def format_bytes(n: Optional[float]) -> str:
    """1536 -> '1.5KiB'."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f}{unit}" if unit != "B" else f"{int(n)}B"
        n /= 1024
    raise AssertionError("unreachable")


def progress_line(k: int, total: Optional[int], record: dict[str, Any]) -> str:
    """`[k/N] key status tokens/s/GPU peak` for one finished point."""
    m = record.get("metrics") or {}
    tps = f"{m['tokens_per_s_per_gpu']:.1f}" if m.get("tokens_per_s_per_gpu") is not None else "-"
    peak = m.get("peak_mem_bytes") or (record.get("predicted") or {}).get("peak_mem_bytes")
    return f"[{k}/{total if total is not None else '?'}] {record['job_key']} {record['status']} {tps} {format_bytes(peak)}"


def status_counts(sweep_dir: str | Path) -> Counter:
    """Points per status among the records of a sweep directory."""
    return Counter(r.get("status") for r in iter_records(sweep_dir))


def closing_line(name: str, sweep_dir: str | Path, counts: Counter) -> str:
    """The sweep's last line: how many points ended in each status."""
    parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
    return f"sweep {name}: {sum(counts.values())} points: {parts or 'none'} ({sweep_dir})"


def has_failures(counts: Counter) -> bool:
    """A sweep with crashed or timed-out points exits non-zero (after finishing every point)."""
    return counts[FAILED] + counts[TIMEOUT] > 0


def raise_for_failures(counts: Optional[Counter]) -> None:
    """Raise `PointsFailed` when the counts hold failed or timed-out points; None (nothing ran) passes."""
    if counts is not None and has_failures(counts):
        raise PointsFailed(counts)


def read_outcome(path: str | Path) -> Optional[Counter]:
    """The status counts a `SweepProgress` wrote to its outcome file; None if it wrote none."""
    outcome = read_json(path)
    return None if outcome is None else Counter(outcome["counts"])


class SweepProgress(Callback):
    """Writes sweep.json, prints a progress line as each point ends and the counts at the end; with
    `outcome_file`, also writes the counts there (JSON) for the command that started Hydra."""

    def __init__(self, outcome_file: Optional[str] = None) -> None:
        self.outcome_file = outcome_file
        self.multirun = False
        self.total: Optional[int] = None
        self.done = 0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.multirun = True
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self.total = count_grid(config)
        index_path = sweep_dir / SWEEP_INDEX
        index = json.loads(index_path.read_text()) if index_path.exists() else {
            "name": config.sweep,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "runs": [],
        }
        index["hardware"] = OmegaConf.to_container(config.hardware, resolve=True)
        index["runs"].append({
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "grid": {str(k): str(v) for k, v in (config.hydra.sweeper.get("params") or {}).items()},
            "overrides": list(config.hydra.overrides.task),
            "sweeper": config.hydra.sweeper._target_,
            "launcher": config.hydra.launcher._target_,
            "points": self.total,
        })
        write_json_atomic(index_path, index)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not self.multirun:  # a single run prints its own summary line
            if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, dict):
                self._write_outcome(Counter([job_return.return_value.get("status")]))
            return
        self.done += 1
        if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, dict):
            print(progress_line(self.done, self.total, job_return.return_value), flush=True)
        else:
            print(f"[{self.done}/{self.total or '?'}] job {config.hydra.job.num} raised: {job_return._return_value!r}",
                  flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        counts = status_counts(config.hydra.sweep.dir)
        print(closing_line(config.sweep, config.hydra.sweep.dir, counts), flush=True)
        self._write_outcome(counts)

    def _write_outcome(self, counts: Counter) -> None:
        if self.outcome_file:
            write_json_atomic(Path(self.outcome_file), {"counts": dict(counts)})
