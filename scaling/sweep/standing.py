"""Where a sweep stands (`scaling status SWEEP_DIR [--watch] [--json]`), read from its directory alone.

It reads the last run's entry of sweep.json (the grid's job keys, the launch settings that decide whether the store
answers a point), the records and the running markers (scaling.store.inflight; a live holder that has stalled is
listed apart), never a Hydra config, so it answers from another shell while the sweep runs or after a crash. The
counting is pure (`summarize`): done by the rule run_point follows (scaling.store.record.answers), the time left by
the grid's forecast (scaling.sweep.grid.wall_estimate_s), the device time as the report counts it
(scaling.store.device_time). What it prints, line by line: docs/sweeps.md.
"""

from __future__ import annotations

import datetime as dt
import socket
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from scaling.core.files import read_json
from scaling.core.schema import LaunchConfig
from scaling.store import inflight
from scaling.store.device_time import DeviceTime, total
from scaling.store.read import RecordError, load_record, record_paths, set_aside_records
from scaling.store.record import SWEEP_INDEX, answers
from scaling.sweep.grid import format_duration, launch_wall_s, status_list, wall_estimate_s

SHOWN = 8
"""Running points listed one per line; the rest are counted."""


@dataclass
class InFlight:
    """A point a job holds now."""

    job_key: str
    state: str
    """running or queued."""
    since: Optional[str]
    slurm_job_id: Optional[str]
    where: Optional[str]
    """`pid P on HOST`, for a point run outside SLURM."""
    checked: bool
    """False when this host could not tell whether the job lives (another host, no squeue)."""


@dataclass
class Status:
    """One look at a sweep directory."""

    sweep_dir: str
    name: Optional[str]
    run: int
    """Runs of the sweep so far (sweep.json entries); 0 without sweep.json."""
    started_at: Optional[str]
    grid_points: Optional[int]
    """Points in the last run's grid; None when the directory has no grid (single points, a search)."""
    done: dict[str, int] = field(default_factory=dict)
    """Points per status among the records that answer the grid's points (all records without a grid)."""
    in_flight: list[InFlight] = field(default_factory=list)
    to_run: Optional[int] = None
    stale: list[str] = field(default_factory=list)
    """`job_key: why` for markers whose job is gone without a record."""
    stalled: list[str] = field(default_factory=list)
    """`job_key: pid P on HOST (since T), stopped, heartbeat 3.0 min old` for live holders that do not progress."""
    not_in_grid: Optional[int] = None
    """Records whose key is not among the last run's grid keys (another grid's points, records of an older
    schema, merged from another store); None without a grid."""
    median_wall_s: Optional[float] = None
    """Median wall time of the recorded points that ran torchrun."""
    launched: int = 0
    """Recorded points that ran torchrun."""
    at_once: int = 1
    """Points running now (at least 1): the pace the estimate assumes."""
    eta_s: Optional[float] = None
    """Estimated time left: waves of `at_once` points of the median wall time."""
    device_time: DeviceTime = field(default_factory=DeviceTime)
    """Device-seconds held by the directory's records, and what they went to (timed_frac: in timed steps)."""
    unreadable: dict[str, str] = field(default_factory=dict)
    """Record files that cannot be read, and those set aside, by path: why (scaling.store.read.load_record)."""


def _time(iso: Optional[str]) -> Optional[dt.datetime]:
    return dt.datetime.fromisoformat(iso) if iso else None


def _done(record: Mapping[str, Any], key: str, launch: LaunchConfig, run_started: Optional[dt.datetime]) -> bool:
    """Whether a record answers its point in this run: the store answered it, or this run wrote it."""
    started = _time((record.get("timing") or {}).get("started_at"))
    return answers(record, key, launch) or (run_started is not None and started is not None and started >= run_started)


def summarize(
    sweep_dir: str,
    index: Optional[Mapping[str, Any]],
    records: Mapping[str, Mapping[str, Any]],
    markers: Mapping[str, Mapping[str, Any]],
    live: Mapping[str, Optional[bool]],
    states: Optional[Mapping[str, str]] = None,
    stalled: Optional[Mapping[str, str]] = None,
) -> Status:
    """Count a sweep directory's points: done per status, in flight, stalled (`stalled`: how each live holder that
    does not progress is so, by job key), to run, stale; the time per point and left."""
    runs = (index or {}).get("runs") or []
    last = runs[-1] if runs else {}
    keys = last.get("job_keys")
    run_started = _time(last.get("started_at"))
    # with no sweep.json (a recipe's directory, single points), the name its records all give, if one
    named = {r.get("sweep") for r in records.values()}
    name = (index or {}).get("name") or (named.pop() if len(named) == 1 else None)
    status = Status(sweep_dir, name, len(runs), last.get("started_at"), len(keys) if keys is not None else None)
    grid = set(keys) if keys is not None else set(records)
    if keys is not None:
        status.not_in_grid = len(set(records) - grid)
    # The launch settings the run recorded (scaling.sweep.progress.Progress.record_grid); a run recorded before
    # prescreen_sample was kept ran none of its predicted_oom points as a sample.
    launch = LaunchConfig(
        rerun=last.get("rerun", "none"),
        repeats=last.get("repeats", 1),
        prescreen_sample=last.get("prescreen_sample", 0.0),
    )
    done = {k for k in grid if k in records and _done(records[k], k, launch, run_started)}
    status.done = dict(Counter(records[k].get("status") for k in done))
    held: set[str] = set()  # points a live job holds, running or stalled
    for key, marker in sorted(
        markers.items(), key=lambda kv: kv[1].get("started_at") or kv[1].get("submitted_at") or ""
    ):
        if key in done:
            continue
        if live.get(key) is False:
            holder = (
                f"SLURM job {marker['slurm_job_id']} ended"
                if marker.get("slurm_job_id")
                else f"pid {marker.get('pid')} on {marker.get('host')} is gone"
            )
            status.stale.append(f"{key}: {holder} without a record (a re-run runs it again)")
            continue
        if (stalled or {}).get(key):
            status.stalled.append(f"{key}: {inflight.holder(marker)}, {stalled[key]}")
            held.add(key)
            continue
        job_id = marker.get("slurm_job_id")
        queued = (states or {}).get(
            job_id, "PENDING" if marker.get("state") == inflight.QUEUED else "RUNNING"
        ) == "PENDING"
        status.in_flight.append(
            InFlight(
                key,
                inflight.QUEUED if queued else inflight.RUNNING,
                marker.get("started_at") or marker.get("submitted_at"),
                job_id,
                None if job_id else f"pid {marker.get('pid')} on {marker.get('host')}",
                live.get(key) is not None,
            )
        )
    held |= {f.job_key for f in status.in_flight}
    if keys is not None:
        status.to_run = len([k for k in grid if k not in done and k not in held])
    status.device_time = total(record.get("timing") or {} for record in records.values())
    walls = [wall for wall in (launch_wall_s(records.get(k)) for k in grid) if wall is not None]
    status.launched = len(walls)
    if walls:
        status.median_wall_s = statistics.median(walls)
        status.at_once = max(1, sum(f.state == inflight.RUNNING for f in status.in_flight))
        if status.to_run is not None:
            status.eta_s = wall_estimate_s(status.to_run + len(status.in_flight), status.at_once, walls)
    return status


def _clock(iso: Optional[str]) -> str:
    t = _time(iso)
    return t.astimezone(dt.timezone.utc).strftime("%H:%M:%S") if t else "?"


def render(s: Status, now: dt.datetime) -> list[str]:
    """The status as printed: a header, then one line per kind of point, then time."""
    if s.started_at:
        ago = format_duration((now - _time(s.started_at)).total_seconds())
        when = f"run {s.run}, started {_time(s.started_at).strftime('%Y-%m-%d %H:%M:%S %Z')} ({ago} ago)"
    else:
        when = "no sweep.json: records of single points"
    grid = (
        f", {s.grid_points} points in its grid"
        if s.grid_points is not None
        else ", no grid (a search or single points)"
    )
    lines = [
        f"sweep {s.name or '?'} ({s.sweep_dir}): {when}{grid}",
        f"  done     {sum(s.done.values()):5d}  {status_list(s.done)}".rstrip(),
    ]
    running = [f for f in s.in_flight if f.state == inflight.RUNNING]
    queued = [f for f in s.in_flight if f.state == inflight.QUEUED]
    for i, f in enumerate(running[:SHOWN]):
        where = f"SLURM job {f.slurm_job_id}" if f.slurm_job_id else f.where
        head = f"  running  {len(running):5d}  " if i == 0 else " " * 18
        lines.append(f"{head}{f.job_key} since {_clock(f.since)} ({where}){'' if f.checked else ', unchecked'}")
    if len(running) > SHOWN:
        lines.append(" " * 18 + f"... and {len(running) - SHOWN} more")
    if queued:
        ids = [f.slurm_job_id or f.job_key for f in queued]
        lines.append(
            f"  queued   {len(queued):5d}  SLURM jobs {', '.join(ids[:SHOWN])}{', ...' if len(ids) > SHOWN else ''}"
        )
    if s.to_run is not None:
        lines.append(f"  to run   {s.to_run:5d}")
    for i, why in enumerate(s.stale[:SHOWN]):
        lines.append((f"  stale    {len(s.stale):5d}  " if i == 0 else " " * 18) + why)
    for i, how in enumerate(s.stalled[:SHOWN]):
        lines.append((f"  stalled  {len(s.stalled):5d}  " if i == 0 else " " * 18) + how)
    if s.not_in_grid:
        lines.append(
            f"  not in the current grid: {s.not_in_grid} (records of another grid or key; `scaling report` reads them)"
        )
    for i, (path, why) in enumerate(sorted(s.unreadable.items())[:SHOWN]):
        head = f"  unreadable {len(s.unreadable):3d}  " if i == 0 else " " * 18
        lines.append(f"{head}{path}: {why}")
    if s.median_wall_s is None:
        lines.append("  time     no launched point recorded yet")
    else:
        left = (
            ""
            if s.eta_s is None
            else "; nothing left to run"
            if s.eta_s == 0
            else f"; about {format_duration(s.eta_s)} left at {s.at_once} at once"
        ) + (f", {len(s.stalled)} stalled point{'s' * (len(s.stalled) > 1)} not counted" if s.stalled else "")
        lines.append(f"  time     median {s.median_wall_s:.1f} s per launched point ({s.launched} recorded){left}")
    spent = s.device_time
    if spent.records:
        lines.append(f"  device   {spent.held()}")
    elif spent.unknown:
        lines.append(f"  device   not known: {spent.unknown} points recorded before device time was kept")
    return lines


class Store:
    """A sweep directory's records and markers; re-reads a record only when its file changed."""

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self._records: dict[str, tuple[int, dict[str, Any]]] = {}
        self.problems: dict[str, str] = {}
        """Records that cannot be read, and those set aside, by file: why."""

    def records(self) -> dict[str, dict[str, Any]]:
        """Status and timing of each record, by job key (those that cannot be read in `problems`)."""
        fresh = {}
        self.problems = {str(e.path.relative_to(self.sweep_dir)): e.reason for e in set_aside_records(self.sweep_dir)}
        for path in record_paths(self.sweep_dir):
            try:
                mtime = path.stat().st_mtime_ns
            except FileNotFoundError:
                mtime = 0  # a dangling link: named below, never kept
            key = path.parent.name
            if key not in self._records or self._records[key][0] != mtime:
                try:
                    record = load_record(path, key)
                except FileNotFoundError:
                    continue
                except RecordError as e:
                    self.problems[str(path.relative_to(self.sweep_dir))] = e.reason
                    continue
                # What the counting reads: the status, the timing and how many launches were ok (launch.repeats);
                # the sweep's name, for a directory without sweep.json.
                launches = (
                    [{"status": launch.get("status")} for launch in record["repeats"]]
                    if isinstance(record.get("repeats"), list)
                    else None
                )
                self._records[key] = (
                    mtime,
                    {
                        "status": record.get("status"),
                        "timing": record.get("timing") or {},
                        "repeats": launches,
                        "metrics": bool(record.get("metrics")) or None,
                        "sweep": record.get("sweep"),
                    },
                )
            fresh[key] = self._records[key]
        self._records = fresh
        return {key: rec for key, (_, rec) in fresh.items()}

    def look(self) -> Optional[Status]:
        """The sweep's status now; None when the directory holds no sweep (no sweep.json, records or markers)."""
        index = read_json(self.sweep_dir / SWEEP_INDEX)
        records, markers = self.records(), inflight.read_markers(self.sweep_dir)
        if index is None and not records and not markers and not self.problems:
            return None
        states = inflight.marker_states(markers)
        live, host = inflight.live_markers(markers, states), socket.gethostname()
        stalled = {key: how for key, m in markers.items() if live.get(key) and (how := inflight.stalled(m, host))}
        status = summarize(str(self.sweep_dir), index, records, markers, live, states, stalled)
        status.unreadable = dict(self.problems)
        return status
