"""The record store: one `<sweep_dir>/<job_key>/result.json` per experiment point.

Owns the record's type (`Record`, its launches `Launch` and its `Provenance` and `Timing`, whose
`to_dict` is the JSON written), the job key (a stable hash of the experiment-defining config), the resume rule (`answers`: which
stored records answer a point, and which of its launches a new run keeps), and the atomic write (temp file + `os.replace`), so a killed driver never leaves half a
record behind. Readers that only look (analysis, status, the sweepers) read the JSON as dicts, each through
scaling.store.read's one loader.
The statuses are scaling.core.enums.Status.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from scaling.core.derived import Derived
from scaling.core.enums import FINAL, Status
from scaling.core.files import Reservation, write_json_atomic
from scaling.core.sample import sampled
from scaling.core.schema import ExperimentConfig, LaunchConfig, without_neutral

SCHEMA_VERSION = 1
"""The record's file format; a field added with a default for older records keeps it."""
SWEEP_INDEX = "sweep.json"
"""The sweep directory's index: name, start, hardware and one entry per run of the sweep."""
SEARCH_BEST = "best.yaml"
"""A search's winning point, written by hydra_plugins.scaling_optuna_sweeper: `best.job_key` names its record."""
NOT_RUN = "not_run"
"""The key that marks what run_point returns for a point it left unrun, recording nothing (`not_run`)."""


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `data` that are fields of the dataclass `cls` (a newer writer's extra keys are left out)."""
    return {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}


def plain(value: Any) -> Any:
    """`value` with every enum member (a `Status`, say) replaced by its plain value, in nested dicts and lists: what
    JSON holds, and what W&B and the sweepers must see (W&B would log a member by its name, `OK`)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


@dataclass(kw_only=True)
class LaunchTiming:
    """Where the time of one launch went."""

    launched_at: Optional[str] = None
    """When torchrun started: ISO 8601, UTC, microseconds."""
    device_wait_s: Optional[float] = None
    """Seconds spent waiting for the device lease before the launch."""
    torchrun_wall_s: Optional[float] = None
    """Seconds from starting torchrun to its exit (a warm job's turn: from handing it the point to its end)."""
    stopped_s: Optional[float] = None
    """Seconds of torchrun_wall_s the driver was stopped (SIGSTOP, a suspended terminal, a frozen VM): in no device
    time (None: never)."""
    launch_overhead_s: Optional[float] = None
    """torchrun_wall_s less stopped_s and the timed window, seconds: start-up, build, warm-up, teardown (None unless
    ok)."""
    devices: Optional[int] = None
    """Devices the launch held: its world size (on CPU, its ranks)."""
    device_s: Optional[float] = None
    """Device-seconds held: (torchrun_wall_s - stopped_s) × devices."""
    timed_device_s: Optional[float] = None
    """Device-seconds in the timed steps: rank 0's timed window × devices (None unless ok)."""
    warmup_device_s: Optional[float] = None
    """Device-seconds in the warm-up steps: rank 0's warm-up phase × devices (None unless ok)."""
    startup_device_s: Optional[float] = None
    """The rest of device_s: interpreter and torch imports, process group, build, the timed steps' batches,
    teardown (None unless ok)."""
    points_before: Optional[int] = None
    """Points the same ranks measured before this one (launch.reuse: a warm job's turn); 0 for a fresh launch,
    None in records made before warm ranks existed."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchTiming:
        """A launch's timing as stored; what it lacks is None."""
        return cls(**_known(cls, data))

    def with_device_time(
        self, devices: int, window_s: Optional[float] = None, warmup_s: Optional[float] = None
    ) -> LaunchTiming:
        """This timing with the device-seconds the launch held ((torchrun_wall_s - stopped_s) × devices) and, when
        the ranks reported their timed window and warm-up (an ok launch), how they split: timed steps, warm-up and
        the rest (start-up and teardown)."""
        wall = None if self.torchrun_wall_s is None else self.torchrun_wall_s - (self.stopped_s or 0.0)
        held = dataclasses.replace(self, devices=devices, device_s=None if wall is None else wall * devices)
        if wall is None or window_s is None or warmup_s is None:
            return held
        timed, warmup = window_s * devices, warmup_s * devices
        return dataclasses.replace(
            held, timed_device_s=timed, warmup_device_s=warmup, startup_device_s=wall * devices - timed - warmup
        )


@dataclass(kw_only=True)
class Launch:
    """One torchrun launch of a point, as the record's `repeats` keeps it."""

    status: Optional[str] = None
    """The launch's outcome: ok, oom, timeout or failed."""
    error: Optional[str] = None
    """The error's last line; None when ok."""
    metrics: Optional[dict[str, Any]] = None
    """Its own metrics block (scaling.job.throughput); None unless ok (an oom may carry its measured peak)."""
    timing: LaunchTiming = field(default_factory=LaunchTiming)
    dir: Optional[str] = None
    """Its own directory, relative to the point's (`launches/<attempt>.<n>`: its config, torchrun log, rank 0's
    report, error files and memory snapshot); None in records written before launches had their own."""

    def to_dict(self) -> dict[str, Any]:
        """The launch as the record's `repeats` holds it."""
        return plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Launch:
        """A launch as stored; what it lacks is None."""
        return cls(
            status=data.get("status"),
            error=data.get("error"),
            metrics=data.get("metrics"),
            timing=LaunchTiming.from_dict(data.get("timing") or {}),
            dir=data.get("dir"),
        )


def launch_dir(point_dir: Path, record: Mapping[str, Any], which: int = -1) -> Optional[Path]:
    """The directory of one launch of a record (its last by default), where its torchrun log, error files and memory
    snapshot are; None when the record has no such launch or names no directory (written before launches had one)."""
    repeats = record.get("repeats") or []
    try:
        name = repeats[which].get("dir")
    except IndexError:
        return None
    return point_dir / name if name else None


@dataclass(kw_only=True)
class Provenance:
    """What made a record."""

    hydra_job_num: Optional[int] = None
    """Hydra's job number in its multirun; None for a single run."""
    overrides: list[str] = field(default_factory=list)
    """The task overrides of the Hydra job."""
    optuna_trial: Optional[int] = None
    """The Optuna trial number when the scaling_optuna sweeper made the point."""
    slurm_job_id: Optional[str] = None
    """`<job>` or `<array>_<task>` under SLURM; None outside it."""
    attempt: Optional[int] = None
    """1 for the first record of a point, one more each time it is recorded again."""
    took_over: Optional[dict[str, Any]] = None
    """The marker of a run of this point that died holding it (host, pid, since when), which this run replaced."""
    model_code: Optional[str] = None
    """The fingerprint of the user's model code it was made with (scaling.model.custom.code); None for the
    built-in family and the project's own factories."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        """Provenance as stored; what it lacks is None (no overrides)."""
        return cls(**_known(cls, data))


@dataclass(kw_only=True)
class Timing:
    """Where the time of one run of the driver on a point went (the launches it made, summed)."""

    started_at: Optional[str] = None
    """When the job began judging the point: ISO 8601, UTC, seconds."""
    wall_s: Optional[float] = None
    """Seconds from the job's start on the point to its record."""
    device_wait_s: Optional[float] = None
    """Seconds waiting for the device lease, over this run's launches."""
    launched_at: Optional[str] = None
    """When this run's first launch started torchrun (LaunchTiming.launched_at)."""
    torchrun_wall_s: Optional[float] = None
    """Seconds in torchrun, over this run's launches."""
    stopped_s: Optional[float] = None
    """Seconds of torchrun_wall_s the driver was stopped, over this run's launches (None: never)."""
    launch_overhead_s: Optional[float] = None
    """Seconds of torchrun outside the timed windows, over this run's ok launches."""
    device_s: Optional[float] = None
    """Device-seconds held, over every launch in `repeats` (earlier runs' kept launches included)."""
    timed_device_s: Optional[float] = None
    """Device-seconds in timed steps, over every ok launch in `repeats`."""
    warmup_device_s: Optional[float] = None
    """Device-seconds in warm-up steps, over every ok launch in `repeats`."""
    startup_device_s: Optional[float] = None
    """Device-seconds in start-up and teardown, over every ok launch in `repeats`."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timing:
        """Timing as stored; what it lacks is None."""
        return cls(**_known(cls, data))

    def with_launches(self, launches: Sequence[Launch]) -> Timing:
        """This timing with the launches of one run of the driver: the first start, and the device wait,
        torchrun wall and launch overhead summed (each launch keeps its own in `repeats`)."""
        times = [launch.timing for launch in launches]
        return dataclasses.replace(
            self,
            launched_at=times[0].launched_at if times else None,
            device_wait_s=_total(t.device_wait_s for t in times),
            torchrun_wall_s=_total(t.torchrun_wall_s for t in times),
            stopped_s=_total(t.stopped_s for t in times),
            launch_overhead_s=_total(t.launch_overhead_s for t in times),
        )

    def with_device_time(self, launches: Sequence[Launch]) -> Timing:
        """This timing with the device time of every launch the record holds (`repeats`, kept ones included),
        summed: a sweep's totals then count each launch once."""
        times = [launch.timing for launch in launches]
        return dataclasses.replace(
            self,
            device_s=_total(t.device_s for t in times),
            timed_device_s=_total(t.timed_device_s for t in times),
            warmup_device_s=_total(t.warmup_device_s for t in times),
            startup_device_s=_total(t.startup_device_s for t in times),
        )


def _total(values: Iterable[Optional[float]]) -> Optional[float]:
    """The sum of the values that are known; None when none is."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None


@dataclass(kw_only=True)
class Record:
    """One experiment point's `result.json`: `to_dict()` is the file, field by field in this order.

    `derived` is typed (scaling.core.derived.Derived, from validation on); the other blocks stay dicts as JSON holds
    them: `metrics` is written from scaling.store.record_blocks.Metrics, `config` from the schema; predicted and env
    are open by design (docs/record.md lists their keys).
    """

    schema_version: Optional[int] = SCHEMA_VERSION
    """The file format (`SCHEMA_VERSION`); None in a record written before it was stated."""
    job_key: str
    """Stable hash of the experiment-defining config (`job_key`)."""
    sweep: Optional[str] = None
    """The sweep's name."""
    status: Optional[str] = None
    """A `Status` (scaling.core.enums); None only while the point is being judged."""
    error: Optional[str] = None
    """Why the point is not ok, in one line; None when ok."""
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved experiment config: model, train, parallel, hardware (`experiment_config`)."""
    derived: Optional[Derived] = None
    """Batch arithmetic, parameter count and FLOPs per token; None for an invalid point."""
    metrics: Optional[dict[str, Any]] = None
    """Throughput, efficiency and memory over the ok launches (scaling.job.throughput); None unless ok."""
    repeats: Optional[list[Launch]] = field(default_factory=list)
    """Every launch, in order; None in a record written before launches were kept (its one launch is itself)."""
    predicted: Optional[dict[str, Any]] = None
    """The memory prediction (scaling.predictor.prescreen.prescreen); None for an invalid point."""
    env: Optional[dict[str, Any]] = None
    """Where the point ran, as the ranks reported it (or the host's, when no rank did)."""
    provenance: Provenance = field(default_factory=Provenance)
    timing: Timing = field(default_factory=Timing)

    def to_dict(self) -> dict[str, Any]:
        """The record as result.json holds it."""
        out = plain(dataclasses.asdict(dataclasses.replace(self, derived=None)))
        out["derived"] = self.derived.to_dict() if self.derived is not None else None  # its None fields left out
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """A stored record, of this version or an older one: what it lacks is None or empty."""
        if "job_key" not in data:
            raise ValueError(f"a record needs a job_key; this one has only {sorted(data)}")
        repeats = data.get("repeats")
        return cls(
            schema_version=data.get("schema_version"),
            job_key=data["job_key"],
            sweep=data.get("sweep"),
            status=data.get("status"),
            error=data.get("error"),
            config=data.get("config") or {},
            derived=Derived.from_dict(data["derived"]) if data.get("derived") is not None else None,
            metrics=data.get("metrics"),
            repeats=None if repeats is None else [Launch.from_dict(launch) for launch in repeats],
            predicted=data.get("predicted"),
            env=data.get("env"),
            provenance=Provenance.from_dict(data.get("provenance") or {}),
            timing=Timing.from_dict(data.get("timing") or {}),
        )

    def write(self, path: str | os.PathLike, room: Optional[Reservation] = None) -> None:
        """Write the record atomically as JSON (into the `room` set aside for it, when given)."""
        if room is not None:
            room.write_json(self.to_dict())
        else:
            write_json_atomic(path, self.to_dict())


ROOM_BASE_BYTES = 16 * 1024
"""What a record takes besides its launches' figures; a disk with less free is full (scaling.core.files.short_of_space)."""


def record_room_bytes(steps: int, repeats: int, world_size: int) -> int:
    """Room to set aside for a record before its launches (scaling.core.files.Reservation), generously: a tiny point's
    record of one launch and one step holds about 8 KiB, each launch adds its metrics, and those grow with the steps
    (step times, losses) and the ranks (their peaks)."""
    return ROOM_BASE_BYTES + repeats * (8 * 1024 + 128 * steps + 256 * world_size)


def not_run(key: str, why: str) -> dict[str, Any]:
    """What run_point returns for a point it did not run and did not record (its record unreadable, its devices or
    its claim not had by the deadline): `why` in one line, which the driver's summary names; a re-run runs it."""
    return {"job_key": key, "status": Status.FAILED, "error": f"not run: {why}", NOT_RUN: why}


def job_key(config: ExperimentConfig) -> str:
    """Short stable hash of the experiment-defining config; logging and launch settings do not count.

    Nor does a field at the neutral value its schema field declares (scaling.core.field_meta.NEUTRAL): a field
    added with a neutral default leaves every key of a store written before it as it was."""
    measured = {
        group: without_neutral(values, type(getattr(config, group))) for group, values in config.experiment().items()
    }
    canonical = json.dumps(measured, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def output_dir(sweep_dir: str, hydra: Any) -> str:
    """The sweep's one folder, absolute: `hydra.sweep.dir` in a multirun (it defaults to `${sweep_dir}`, so
    overriding either moves records, sweep.json, the study and best.yaml together), else `sweep_dir`.

    `hydra` is the composed `hydra` node (HydraConfig.get() in a job, cfg.hydra in a sweeper)."""
    from hydra.types import RunMode

    chosen = hydra.sweep.dir if hydra.mode == RunMode.MULTIRUN else sweep_dir
    return os.path.join(hydra.runtime.cwd, chosen)  # an absolute `chosen` stays as it is


def job_dir(sweep_dir: str | os.PathLike, key: str) -> Path:
    """Folder of one point inside a sweep directory."""
    return Path(sweep_dir) / key


def next_attempt(previous: Optional[Mapping[str, Any]]) -> int:
    """The attempt number of a new record of a point: 1, or one more than the record it replaces."""
    if previous is None:
        return 1
    return int((previous.get("provenance") or {}).get("attempt") or 1) + 1


def ok_launches(record: Optional[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ok launches a stored record holds: its `repeats` entries of status ok (a record written
    before repeats were kept counts its one ok launch)."""
    if record is None:
        return []
    if isinstance(record.get("repeats"), list):
        return [dict(launch) for launch in record["repeats"] if launch.get("status") == Status.OK]
    if record.get("status") == Status.OK and record.get("metrics"):
        return [
            {
                "status": Status.OK,
                "error": None,
                "metrics": record["metrics"],
                "timing": dict(record.get("timing") or {}),
            }
        ]
    return []


def kept_launches(record: Optional[Mapping[str, Any]], rerun: str) -> list[dict[str, Any]]:
    """The launches a new run of a point keeps: the stored ok ones (none with launch.rerun=all)."""
    return [] if rerun == "all" else ok_launches(record)


RETRIED_FOR_NEW_CODE = frozenset({Status.FAILED, Status.TIMEOUT, Status.INVALID})
"""Statuses an edited model may change: run again when the model's code is not the code they were recorded with."""


def answers(
    record: Optional[Mapping[str, Any]], key: str, launch: LaunchConfig, model_code: Optional[str] = None
) -> bool:
    """Whether a stored record answers its point, so that it is not run again: ok with at least
    launch.repeats ok launches (an ok point with fewer launches the missing ones), predicted_oom unless the
    pre-screen's sample (launch.prescreen_sample) runs the point anyway, invalid and oom always, failed and
    timeout unless launch.rerun=failed; none with launch.rerun=all; a failed, timeout or invalid record of other
    model code than `model_code` (the point's now, when known) never. run_point, the grid and Optuna sweepers
    and `scaling status` all decide by it."""
    if record is None or launch.rerun == "all":
        return False
    recorded = (record.get("provenance") or {}).get("model_code")
    if record.get("status") in RETRIED_FOR_NEW_CODE and None not in (model_code, recorded) and recorded != model_code:
        return False
    status = record.get("status")
    if status == Status.OK:
        return len(ok_launches(record)) >= launch.repeats
    if status == Status.PREDICTED_OOM and sampled(key, float(launch.prescreen_sample)):
        return False
    return status in FINAL or (launch.rerun != "failed" and status in (Status.FAILED, Status.TIMEOUT))
