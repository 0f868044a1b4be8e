"""The Hydra job: one experiment point from config to record (`scaling run [overrides]`, `scaling run -m ...`).

`run_point` shows a point's life top-down, one line per hop: the store, the claim, validate, count the model,
predict its memory, lease its devices, launch torchrun, write the record (then W&B). The helpers below it do each
hop. This process never imports CUDA and never becomes a rank; a point never raises into the sweep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import functools
import itertools
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from scaling.core.derived import Derived, DerivedModel, ParamTensors
from scaling.core.enums import Status
from scaling.core.files import NO_SPACE, Reservation, short_of_space, stop_when_unwritable, write_json_atomic
from scaling.core.model_group import model_hash
from scaling.core.recompute import every_error
from scaling.core.schema import CONF_DIR, ConfigRefused, ExperimentConfig, TrainConfig, UnknownKey
from scaling.core.units import format_bytes
from scaling.core.validate import InvalidConfig, pipeline_stages, validate
from scaling.engine import peak_flops
from scaling.engine.jobfiles import CONFIG_FILE, LAUNCHES_DIR, RESULT_FILE, TORCHRUN_LOG, WORKER_OUTPUT, WorkerReport
from scaling.engine.lifetime import gate
from scaling.job import wandb_log
from scaling.job.throughput import not_finite, repeats_metrics, throughput_metrics
from scaling.launch import devices, slurm, torchrun, warm
from scaling.model.family import checked, family_of
from scaling.model.shape import BLOCK, ROOT
from scaling.predictor.prescreen import predicted_oom, prescreen
from scaling.store import inflight
from scaling.store.read import RecordError, read_record
from scaling.store.record import (
    ROOM_BASE_BYTES,
    Launch,
    LaunchTiming,
    Provenance,
    Record,
    Timing,
    answers,
    job_dir,
    job_key,
    kept_launches,
    next_attempt,
    not_run,
    output_dir,
    record_room_bytes,
)

OPTUNA_SWEEPER = "hydra_plugins.scaling_optuna_sweeper.sweeper.ScalingOptunaSweeper"
"""The `_target_` of the Optuna sweeper (hydra_plugins.scaling_optuna_sweeper takes it from here): its jobs are
numbered by trial."""


def run_point(c: ExperimentConfig, provenance: Optional[Provenance] = None) -> dict[str, Any]:
    """One point's life, top-down, to its record (`Record.to_dict()`, what the sweepers receive); never raises for a
    bad point. `provenance` says what made it (`hydra_provenance`)."""
    sweep_dir, key = Path(c.sweep_dir).resolve(), job_key(c)
    point_dir = job_dir(sweep_dir, key)
    lead = slurm.is_lead_task(os.environ)  # the task that writes the record (the only one outside multi-node SLURM)
    # the user's model code, recorded: a failed or invalid point of other code runs again (an edited model)
    provenance = dataclasses.replace(provenance or Provenance(), model_code=family_of(c.model).code())
    existing, answer = _stored(
        sweep_dir, key, c, "", provenance.model_code
    )  # 1. the store: a record that answers the point ends it here
    if answer is not None:
        return answer
    try:  # 2. claim it: another run's claim is waited for within launch.lease_wait_s, launch.stalled_wait_s if stalled
        waits = (c.launch.lease_wait_s, c.launch.stalled_wait_s)
        claimed = inflight.claim(point_dir, os.environ, 0.2, key, *waits) if lead else contextlib.nullcontext()
    except inflight.ClaimTimeout as e:
        print(f"[scaling] {key}: not run, {e}", file=sys.stderr, flush=True)
        return not_run(key, str(e))
    with claimed as claim:
        if lead:  # the store again, now that nobody else runs the point (a holder we waited for wrote it)
            existing, answer = _stored(sweep_dir, key, c, " while this run waited", provenance.model_code)
            if answer is not None:
                return answer
        t0, record = time.perf_counter(), _new_record(c, key, existing, provenance, claim)
        try:
            derived = validate(c)  # 3. validate: an impossible configuration is `invalid`, before any process
            record.derived = derived_block(c, derived)  # 4. the model counted (one the user brings built and checked)
            record.predicted = prediction = prescreen(c, derived.grad_acc, kept_in=c.sweep_dir)  # 5. predict its memory
        except InvalidConfig as e:  # (5: a model one brings whose first step under its tp plan fails when traced)
            return _finish(_ended(record, Status.INVALID, str(e), c), point_dir, t0, c)
        if predicted_oom(prediction):  # predicted > (1 + prescreen_margin) x capacity, and not in the sample
            return _finish(_ended(record, Status.PREDICTED_OOM, prediction["reason"], c), point_dir, t0, c)
        argv = functools.partial(  # under SLURM the allocation decides how torchrun starts; elsewhere --standalone
            slurm.point_argv,
            job_key=key,
            world_size=derived.world_size,
            devices_per_node=c.hardware.devices_per_node,
            env=os.environ,
            port=c.launch.master_port,
        )
        try:
            argv(point_dir / CONFIG_FILE)  # refused here, before any launch, when this allocation cannot hold it
            lease = devices.request(c, os.environ)  # 6. lease its devices
        except ValueError as e:
            return _finish(_ended(record, Status.FAILED, str(e), c), point_dir, t0, c)
        resumed = [Launch.from_dict(launch) for launch in kept_launches(existing, c.launch.rerun)]
        # the record's room set aside before anything is measured: a full disk stops the run before a launch, never
        # between a measurement and its record
        room = record_room_bytes(c.train.warmup_steps + c.train.steps, c.launch.repeats, derived.world_size)
        try:  # 7. launch torchrun, launch.repeats times
            with Reservation(point_dir / RESULT_FILE, room) if lead else contextlib.nullcontext() as reserved:
                _launch_repeats(c, record, resumed, point_dir, argv, lease, claim)
                return _finish(record, point_dir, t0, c, reserved) if lead else record.to_dict()  # 8. record, W&B
        except devices.LeaseTimeout as e:  # never started: nothing to record (a re-run runs it)
            print(f"[scaling] {key}: not run, {e}", file=sys.stderr, flush=True)
            return not_run(key, str(e))


def _stored(
    sweep_dir: Path, key: str, c: ExperimentConfig, when: str, model_code: Optional[str]
) -> tuple[Optional[dict[str, Any]], Optional[dict[str, Any]]]:
    """(the point's stored record, what run_point returns when the store answers the point or cannot be read)."""
    try:
        existing = read_record(sweep_dir, key, set_aside_corrupt=True)  # NewerRecord stops the command
    except RecordError as e:  # another user's 0600 record, a directory: left as it is, the point not run
        print(f"[scaling] {key}: not run, its record cannot be read: {e}", file=sys.stderr, flush=True)
        return None, not_run(key, f"its record cannot be read: {e}")
    if answers(existing, key, c.launch, model_code):  # a predicted_oom point in the sample runs anyway
        why = f" ({existing['error']})" if existing.get("status") == Status.INVALID and existing.get("error") else ""
        print(f"[scaling] {key} already recorded as {existing['status']}{why}{when}: skipped", flush=True)
        return existing, existing
    return existing, None


def _new_launch_dir(point_dir: Path, attempt: int, n: int, environ: Mapping[str, str]) -> Path:
    """A directory of its own for the n-th launch (0-based, the record's count) of a point's `attempt`:
    `launches/<attempt>.<n>`, made by this launch, so that nothing an earlier launch or a killed driver left is read
    as this launch's or removed. Under SLURM its name carries the job (and its requeue count), which every node's task
    of a multi-node point shares; elsewhere a name a dead launch left is not reused (`-2`, `-3`, ... follow)."""
    root = point_dir / LAUNCHES_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = f"{attempt}.{n}"
    job = inflight.slurm_job_id(environ)
    if job is not None:
        path = root / f"{name}-slurm{job}.{environ.get('SLURM_RESTART_COUNT', '0')}"
        path.mkdir(exist_ok=True)
        return path
    for k in itertools.count(1):
        path = root / (name if k == 1 else f"{name}-{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _new_record(
    c: ExperimentConfig,
    key: str,
    existing: Optional[dict[str, Any]],
    provenance: Optional[Provenance],
    claim: Optional[inflight.Claim],
) -> Record:
    """The record of a point about to be judged: its config and what made it (a stale claim taken over is said,
    here and in the record), nothing measured yet."""
    took_over = claim.took_over if claim is not None else None
    if took_over is not None:
        print(
            f"[scaling] {key}: took over from {inflight.holder(took_over)}, which is gone", file=sys.stderr, flush=True
        )
    return Record(
        job_key=key,
        sweep=c.sweep,
        config=c.experiment(),
        provenance=dataclasses.replace(
            provenance or Provenance(),
            slurm_job_id=inflight.slurm_job_id(os.environ),
            attempt=next_attempt(existing),
            took_over=took_over,
        ),
        timing=Timing(started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")),
    )


def _ended(record: Record, status: str, error: str, c: ExperimentConfig) -> Record:
    """A point that ends before torchrun starts: its status, the reason, and the host it was judged on."""
    record.status, record.error, record.env = status, error, _host_env(c)
    return record


def _launch_repeats(
    c: ExperimentConfig,
    record: Record,
    launches: list[Launch],
    point_dir: Path,
    argv: Callable[[Path], list[str]],
    lease: Any,
    claim: Optional[inflight.Claim],
) -> None:
    """Launch the point until it has launch.repeats ok launches (`launches` holds the ones a resumed point
    kept) or one launch is not ok; the record's metrics are those of all its ok launches.

    Concurrent points on this host take disjoint GPUs (CPU points: the host, one at a time). The lease is
    given back only once no process of the point is left. Each repeat is a fresh torchrun (with launch.reuse,
    a turn of this process's warm job, which holds the lease between points) in a directory of its own
    (`_new_launch_dir`, with its own config.json, made from `argv(config_path)`); the record is written after
    each, so a killed sweep keeps the repeats it finished. Time this process was stopped during a launch (the
    claim's watch: None for a multi-node point's other tasks) is no device time."""
    kept, lead, waits = len(launches), claim is not None, (c.launch.lease_wait_s, c.launch.stalled_wait_s)
    log_name = TORCHRUN_LOG if lead else f"torchrun.task{os.environ['SLURM_PROCID']}.log"
    # Warm ranks serve points that run as one torchrun on this node (a multi-node SLURM point starts fresh).
    warm_ranks = (
        c.launch.reuse
        and slurm.placement(c.parallel.layout.world_size, c.hardware.devices_per_node, os.environ).nodes == 1
    )
    assert record.derived is not None, "a point is counted before it launches"
    config, derived = ranks_config(c, record.derived.to_dict(), record.job_key), record.derived

    def new_launch() -> tuple[Path, Path]:  # this launch's directory and the config.json its ranks read there
        launch_dir = _new_launch_dir(point_dir, record.provenance.attempt or 1, len(launches), os.environ)
        write_json_atomic(launch_dir / CONFIG_FILE, config)
        return launch_dir, launch_dir / CONFIG_FILE

    for _ in range(max(1, c.launch.repeats - kept)):
        outcome = None  # each launch makes its directory once it holds its devices: a lease not had leaves none
        if warm_ranks:
            try:
                shape = warm.shape_of(c, lease, os.environ)
                with warm.job_for(shape, c.launch.reuse_idle_s, *waits) as job:
                    held = job.held
                    launch_dir, config_path = new_launch()
                    peak = peak_flops.resolve_peak_flops(c.hardware, c.train.precision)
                    launched_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
                    started = time.monotonic()  # the claim's watch says how much of the launch this process was stopped
                    outcome, points_before = job.run(config_path, launch_dir, c.launch.timeout_s, log_name)
            except warm.JobGone as e:  # it died between points: this point never started; a fresh launch measures it
                print(f"[scaling] {record.job_key}: {e}: measured by a fresh launch", file=sys.stderr, flush=True)
        if outcome is None:
            points_before = 0
            with warm.fresh_lease(lease, c.launch.devices, *waits) as held:
                launch_dir, config_path = new_launch()
                # The CPU peak that MFU divides by is measured here, while this point holds the host.
                peak = peak_flops.resolve_peak_flops(c.hardware, c.train.precision)
                launched_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
                started = time.monotonic()
                env = torchrun.job_env(c.hardware.threads_per_device, held.visible, c.hardware.device == "cuda")
                outcome = torchrun.launch_torchrun(argv(config_path), launch_dir, c.launch.timeout_s, env, log_name)
        if not lead:  # another node's task of a multi-node point: its lead task writes the record
            if outcome.status != Status.OK:
                return
            continue
        gate("measured")  # tests only: the driver between a measurement and its record
        stopped_s = claim.stopped_s(started) if claim is not None else 0.0
        this, env_block = _launch_entry(c, derived, outcome, launch_dir, launched_at, held.wait_s, peak, stopped_s)
        if this.status != Status.OK and short_of_space(launch_dir, this.error, ROOM_BASE_BYTES):
            # its ranks could not write what they measured: no result of the point, and the run stops
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {this.error}", str(launch_dir))
        this.timing.points_before, this.dir = points_before, str(launch_dir.relative_to(point_dir))
        launches.append(this)
        record.status, record.error, record.repeats = this.status, this.error, launches
        record.env = {**env_block, "devices": held.visible}
        record.metrics = (
            repeats_metrics([r.metrics for r in launches], derived, c.parallel.layout)
            if this.status == Status.OK
            else None
        )
        record.timing = record.timing.with_launches(launches[kept:]).with_device_time(launches)
        if this.status != Status.OK or len(launches) >= c.launch.repeats:
            return  # its record is written once, by _finish, into the room set aside for it
        try:  # more to launch: what is measured so far is kept, space permitting
            record.write(point_dir / RESULT_FILE)
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise


def _launch_entry(
    c: ExperimentConfig,
    derived: Derived,
    outcome: torchrun.Outcome,
    launch_dir: Path,
    launched_at: str,
    device_wait_s: float,
    peak: peak_flops.PeakFlops,
    stopped_s: float = 0.0,
) -> tuple[Launch, dict[str, Any]]:
    """One launch as the record's `repeats` keeps it, and the `env` it ran in (what the ranks reported, or the
    host's when rank 0 wrote nothing)."""
    this = Launch(
        status=outcome.status,
        error=outcome.error,
        timing=LaunchTiming(
            launched_at=launched_at,
            device_wait_s=device_wait_s,
            torchrun_wall_s=outcome.wall_s,
            stopped_s=round(stopped_s, 1) or None,
        ),
    )
    report = WorkerReport.read(launch_dir / WORKER_OUTPUT)
    diverged = not_finite(report) if outcome.status == Status.OK and report is not None else None
    if outcome.status == Status.OK and report is not None and diverged is None:
        this.metrics = throughput_metrics(report, derived, peak, c.parallel.layout)
        this.timing.launch_overhead_s = outcome.wall_s - stopped_s - report.measured_window_s
        this.timing = this.timing.with_device_time(
            derived.world_size, report.measured_window_s, report.phases_s.get("warmup_s")
        )
        return this, {**report.env, "warmup_steps_run": report.warmup_steps_run, "compile": report.compile}
    if outcome.status == Status.OK:  # a NaN loss is never ok: nothing of it is published
        this.status, this.error = Status.FAILED, diverged or f"torchrun exited 0 but rank 0 wrote no {WORKER_OUTPUT}"
    this.timing = this.timing.with_device_time(derived.world_size)
    return this, _host_env(c)


def _host_env(c: ExperimentConfig) -> dict[str, Any]:
    """What the record says about the machine when no rank reported it (the point never ran)."""
    hw = c.hardware
    return {
        "torch": peak_flops.torch_version(),
        "python": platform.python_version(),
        "device_name": hw.name,
        "backend": hw.backend,
        "hostname": socket.gethostname(),
        "threads_per_device": hw.threads_per_device,
        "memory_capacity": ("real" if hw.device == "cuda" else "emulated") if hw.memory_gb else "unlimited",
    }


def ranks_config(c: ExperimentConfig, derived: Mapping[str, Any], key: str) -> dict[str, Any]:
    """What a launch's ranks read (its config.json, scaling.engine.jobfiles.PointJob): the config, the record's
    derived block, and the runtime settings (the process group's timeout below the point's)."""
    runtime = {
        "job_key": key,
        "pg_timeout_s": torchrun.process_group_timeout_s(c.launch.timeout_s, c.launch.collective_timeout_s),
    }
    return {**c.to_dict(), "derived": derived, "runtime": runtime}


def derived_block(c: ExperimentConfig, derived: Derived) -> Derived:
    """The record's `derived` block as validation made it, with the parameter count and the FLOPs per token (the
    built-in family's closed form; a model the user brings counted by torch's FlopCounterMode and named in `model`);
    InvalidConfig when a model the user brings breaks the contract."""
    counted = checked(c.model, c.train.seq_len, c.parallel.tp, pipeline_stages(c.parallel), c.parallel.zero_stage)
    if c.train.recompute != "none" and not family_of(c.model).closed_form:  # the built-in family's: in validate
        error = every_error(c.train.recompute_every, counted.n_blocks)
        if error:
            raise InvalidConfig([error])
    block = derived.counted(
        counted.n_params,
        counted.flops_per_token,
        counted.hw_flops_per_token(c.train.recompute, c.train.recompute_every),
    )
    if not family_of(c.model).closed_form:  # counted: its record keeps its shape (derived.model)
        block.flops_source, block.uncounted_ops = counted.source, list(counted.uncounted_ops)
        block.model = DerivedModel(
            name=c.model.name,
            source=c.model.source,
            block=counted.block,
            n_blocks=counted.n_blocks,
            init=counted.init,
            attention=counted.attention,
            config_hash=model_hash(c.model),
            param_tensors=ParamTensors(
                module=[BLOCK if in_block else ROOT for _, in_block, _, _ in counted.tensors],
                rows=[rows for _, _, rows, _ in counted.tensors],
                cols=[cols for _, _, _, cols in counted.tensors],
            ),
        )
    return block


def _finish(
    record: Record, point_dir: Path, t0: float, c: ExperimentConfig, room: Optional[Reservation] = None
) -> dict[str, Any]:
    """Time, write atomically (into the `room` set aside for it), log the record to W&B (which may fail harmlessly),
    then announce it."""
    record.timing.wall_s = time.perf_counter() - t0
    record.write(point_dir / RESULT_FILE, room)
    written = record.to_dict()
    wandb_failure = wandb_log.log_point(written, c.logger, c.sweep_dir)
    print(_summary_line(record) + (f"; {wandb_failure}" if wandb_failure else ""), flush=True)
    return written


def _summary_line(record: Record) -> str:
    """`[scaling] key status tokens/s/GPU mfu peak (point) error` for the job's log (a W&B failure follows)."""
    c, m = record.config, record.metrics or {}
    point = (
        f"model={c['model']['name']} seq={c['train']['seq_len']} mbs={c['train']['mbs']} "
        f"ga={record.derived.grad_acc if record.derived else c['train']['grad_acc']} "
        f"dp={c['parallel']['dp']} zero={c['parallel']['zero_stage']}"
    )
    layout = {k: c["parallel"].get(k) for k in ("dp_shard", "tp", "pp")}
    point += "".join(f" {k}={v}" for k, v in layout.items() if v not in (None, 1))
    train = c["train"]  # what else tells two points of one layout apart, where it is not the schema's default
    point += "".join(
        f" {k}={train[k]}"
        for k in ("precision", "recompute")
        if train.get(k, getattr(TrainConfig, k)) != getattr(TrainConfig, k)
    )
    if (
        train.get("recompute", TrainConfig.recompute) != TrainConfig.recompute
        and (train.get("recompute_every") or 1) > 1
    ):
        point += f" recompute_every={train['recompute_every']}"
    if (c["parallel"].get("pp") or 1) > 1:  # the schedule (and its virtual stages) of a pipeline
        virtual = c["parallel"].get("pp_virtual") or 1
        point += f" pp_schedule={c['parallel'].get('pp_schedule')}" + (f" pp_virtual={virtual}" if virtual > 1 else "")
    figures = ""
    if m:
        figures = (
            f" tokens/s/GPU={m['tokens_per_s_per_gpu']:.1f} mfu={100 * m['mfu']:.2f}%"
            f" peak={format_bytes(m['peak_mem_bytes'])}"
        )
    error = f" error: {record.error}" if record.error else ""
    return f"[scaling] {record.job_key} {record.status}{figures} ({point}){error}"


def hydra_provenance(hydra: DictConfig) -> Provenance:
    """What made this job: Hydra's job number (multirun) and task overrides, and the Optuna trial number
    when the scaling_optuna sweeper made it (its jobs are numbered by trial)."""
    num = OmegaConf.select(hydra, "job.num", default=None, throw_on_missing=False)
    searched = OmegaConf.select(hydra, "sweeper._target_") == OPTUNA_SWEEPER
    return Provenance(hydra_job_num=num, overrides=list(hydra.overrides.task), optuna_trial=num if searched else None)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry point: resolve the config and run the point."""
    hydra_cfg = HydraConfig.get()
    cfg.sweep_dir = output_dir(cfg.sweep_dir, hydra_cfg)
    try:
        point = ExperimentConfig.from_dict(OmegaConf.to_container(cfg, resolve=True))
    except UnknownKey as e:  # `+train.seqlen=64`, a misspelt model-file key: the command line is refused, exit 2
        raise ConfigRefused(str(e)) from None
    devices.start_sweep_watcher()  # a worker of the parallel launcher dies with a killed sweep
    with stop_when_unwritable(cfg.sweep_dir):  # a store that refuses a write stops the run, not each point in turn
        return run_point(point, hydra_provenance(hydra_cfg))
