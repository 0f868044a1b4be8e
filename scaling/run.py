"""The Hydra job: one experiment point from config to record.

    python -m scaling.run [overrides]          one point
    python -m scaling.run -m [sweep overrides] a multirun (see sweeps/)

validate -> predict memory -> already in the store? -> launch torchrun -> classify -> write
result.json atomically -> log to W&B -> return the record (the sweeper reads its metrics).
This process never imports CUDA and never becomes a rank; a point never raises into the sweep.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from scaling import devices, launch, slurm, wandb_log
from scaling.engine import flops
from scaling.config import CONF_DIR, register_configs
from scaling.predictor.analytic import prescreen, sampled
from scaling.metrics import repeats_metrics, throughput_metrics
from scaling.engine.model import ModelArgs, param_count
from scaling.record import (
    FAILED, INVALID, OK, PREDICTED_OOM, RESULT_FILE, SCHEMA_VERSION, experiment_config, job_dir, job_key, kept_launches,
    launches_timing, next_attempt, output_dir, read_record, should_skip,
)
from scaling.validate import Derived, InvalidConfig, validate
from scaling.engine.jobfiles import CONFIG_FILE, ELASTIC_LOGS, TORCHRUN_LOG, WORKER_OUTPUT, read_json, write_json_atomic



def _host_env(cfg: dict[str, Any]) -> dict[str, Any]:
    """What the record says about the machine when no rank reported it (the point never ran)."""
    import torch  # CPU-side import only: version string, no device initialisation

    hw = cfg["hardware"]
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device_name": hw["name"],
        "backend": hw["backend"],
        "hostname": socket.gethostname(),
        "threads_per_device": hw["threads_per_device"],
        "memory_capacity": ("real" if hw["device"] == "cuda" else "emulated") if hw["memory_gb"] else "unlimited",
    }


def _derived_block(cfg: dict[str, Any], derived: Derived) -> dict[str, Any]:
    args = ModelArgs.from_dict(cfg["model"])
    seq = cfg["train"]["seq_len"]
    return {
        **derived.as_dict(),
        "n_params": param_count(args),
        "flops_per_token": flops.flops_per_token(args, seq),
        "hw_flops_per_token": flops.hardware_flops_per_token(args, seq, cfg["train"]["recompute"] == "full"),
    }


def _summary_line(record: dict[str, Any]) -> str:
    c, m = record["config"], record.get("metrics") or {}
    point = (f"model={c['model']['name']} seq={c['train']['seq_len']} mbs={c['train']['mbs']} "
             f"ga={(record.get('derived') or {}).get('grad_acc', c['train']['grad_acc'])} "
             f"dp={c['parallel']['dp']} zero={c['parallel']['zero_stage']}")
    figures = ""
    if m:
        figures = (f" tokens/s/GPU={m['tokens_per_s_per_gpu']:.1f} mfu={100 * m['mfu']:.2f}%"
                   f" peak={m['peak_mem_bytes'] / 2**20:.1f}MiB")
    error = f" error: {record['error']}" if record.get("error") else ""
    return f"[scaling] {record['job_key']} {record['status']}{figures} ({point}){error}"


def run_point(cfg: dict[str, Any], provenance: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Run one resolved experiment config (plain dict) to its record; never raises for a bad point.

    `provenance` says what made the point (see `hydra_provenance`); the record adds its attempt number."""
    sweep_dir = Path(cfg["sweep_dir"]).resolve()
    key = job_key(cfg)
    existing = read_record(sweep_dir, key)
    if existing and existing["status"] == PREDICTED_OOM and sampled(key, cfg["launch"]["prescreen_sample"]):
        existing = None  # a point the pre-screen skipped, now in the sample that runs anyway
    if should_skip(existing, cfg["launch"]["rerun"], cfg["launch"]["repeats"]):
        print(f"[scaling] {key} already recorded as {existing['status']}: skipped", flush=True)
        return existing
    launches = kept_launches(existing, cfg["launch"]["rerun"])  # a resumed point launches only the missing repeats
    kept = len(launches)

    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "job_key": key, "sweep": cfg["sweep"], "status": None, "error": None,
        "config": experiment_config(cfg), "derived": None, "metrics": None, "repeats": [], "predicted": None, "env": None,
        "provenance": {"hydra_job_num": None, "overrides": [], "optuna_trial": None, **(provenance or {}),
                       "attempt": next_attempt(existing)},
        "timing": {"started_at": started, "wall_s": None, "device_wait_s": None, "launched_at": None,
                   "torchrun_wall_s": None, "launch_overhead_s": None},
    }
    jd = job_dir(sweep_dir, key)
    try:
        derived = validate(cfg)
    except InvalidConfig as e:
        record.update(status=INVALID, error=str(e), env=_host_env(cfg))
        return _finish(record, jd, t0, cfg)

    record["derived"] = _derived_block(cfg, derived)
    record["predicted"] = prediction = prescreen(cfg, derived.grad_acc)
    if prediction["skip"] and not prediction["sampled"]:  # predicted > (1 + prescreen_margin) x capacity
        record.update(status=PREDICTED_OOM, error=prediction["reason"], env=_host_env(cfg))
        return _finish(record, jd, t0, cfg)
    lead = slurm.is_lead_task(os.environ)
    jd.mkdir(parents=True, exist_ok=True)
    timeout_s = cfg["launch"]["timeout_s"]
    runtime = {"job_key": key, "pg_timeout_s": launch.process_group_timeout_s(timeout_s)}
    write_json_atomic(jd / CONFIG_FILE, {**cfg, "derived": record["derived"], "runtime": runtime})
    try:
        # Under SLURM the allocation decides how torchrun starts (one node, or one torchrun per node joined by
        # a c10d rendezvous); elsewhere it is `torchrun --standalone`. This node must hold its ranks.
        argv = slurm.point_argv(jd / CONFIG_FILE, key, derived.world_size, cfg["hardware"]["devices_per_node"],
                                os.environ, cfg["launch"]["master_port"])
        lease = devices.request(cfg, os.environ)
    except ValueError as e:
        record.update(status=FAILED, error=str(e), env=_host_env(cfg))
        return _finish(record, jd, t0, cfg)
    log_name = TORCHRUN_LOG if lead else f"torchrun.task{os.environ['SLURM_PROCID']}.log"
    hw = cfg["hardware"]
    # Concurrent points on this host take disjoint GPUs (CPU points: the host, one at a time). The lease is
    # given back only once no process of the point is left. Each repeat is a fresh torchrun; the record is
    # written after each, so a killed sweep keeps the repeats it finished.
    for _ in range(max(1, cfg["launch"]["repeats"] - kept)):
        if lead:  # only the task that writes the record cleans the job directory (the others share it)
            for stale in (WORKER_OUTPUT, TORCHRUN_LOG):
                (jd / stale).unlink(missing_ok=True)
            shutil.rmtree(jd / ELASTIC_LOGS, ignore_errors=True)  # an earlier launch's errors are not this one's
        with devices.hold(lease, cfg["launch"]["devices"]) as held:
            # The CPU peak that MFU divides by is measured here, while this point holds the host.
            peak = flops.resolve_peak_flops(hw, cfg["train"]["precision"], hw["threads_per_device"], hw["device"])
            launched_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
            env = launch.job_env(hw["threads_per_device"], held.visible, hw["device"] == "cuda")
            outcome = launch.launch_torchrun(argv, jd, timeout_s, env, log_name)
            launch.end_point_processes(jd / CONFIG_FILE)
        if not lead:  # another node's task of a multi-node point: its lead task writes the record
            if outcome.status != OK:
                break
            continue
        this = {"status": outcome.status, "error": outcome.error, "metrics": None,
                "timing": {"launched_at": launched_at, "device_wait_s": held.wait_s, "torchrun_wall_s": outcome.wall_s,
                           "launch_overhead_s": None}}
        worker_out = read_worker_output(jd)
        env_block = _host_env(cfg)
        if outcome.status == OK and worker_out is not None:
            this["metrics"] = throughput_metrics(worker_out, record["derived"], peak)
            this["timing"]["launch_overhead_s"] = outcome.wall_s - worker_out["measured_window_s"]
            env_block = {**worker_out["env"], "warmup_steps_run": worker_out["warmup_steps_run"],
                         "compile": worker_out["compile"]}
        elif outcome.status == OK:
            this.update(status=FAILED, error=f"torchrun exited 0 but rank 0 wrote no {WORKER_OUTPUT}")
        launches.append(this)
        record.update(status=this["status"], error=this["error"], repeats=launches, env={**env_block, "devices": held.visible},
                      metrics=repeats_metrics([r["metrics"] for r in launches], record["derived"])
                      if this["status"] == OK else None)
        record["timing"].update(launches_timing(launches[kept:]))
        if this["status"] != OK:
            break
        write_json_atomic(jd / RESULT_FILE, record)
    if not lead:
        return record
    return _finish(record, jd, t0, cfg)


def read_worker_output(jd: Path) -> Optional[dict[str, Any]]:
    """What rank 0 wrote, if anything."""
    return read_json(jd / WORKER_OUTPUT)


def _finish(record: dict[str, Any], jd: Path, t0: float, cfg: dict[str, Any]) -> dict[str, Any]:
    """Time, write atomically, announce the record, then log it to W&B (which may fail harmlessly)."""
    record["timing"]["wall_s"] = time.perf_counter() - t0
    write_json_atomic(jd / RESULT_FILE, record)
    print(_summary_line(record), flush=True)
    wandb_log.log_point(record, cfg["logger"], cfg["sweep_dir"])
    return record




def hydra_provenance(hydra: DictConfig) -> dict[str, Any]:
    """What made this job: Hydra's job number (multirun) and task overrides, and the Optuna trial number
    when the scaling_optuna sweeper made it (its jobs are numbered by trial)."""
    from hydra_plugins.scaling_optuna_sweeper.config import ScalingOptunaSweeperConf

    num = OmegaConf.select(hydra, "job.num", default=None, throw_on_missing=False)
    searched = OmegaConf.select(hydra, "sweeper._target_") == ScalingOptunaSweeperConf._target_
    return {"hydra_job_num": num, "overrides": list(hydra.overrides.task), "optuna_trial": num if searched else None}


register_configs()
slurm.register_resolvers()  # conf/hydra/launcher/slurm.yaml reads them while Hydra composes
devices.register_resolvers()  # conf/hydra/launcher/parallel.yaml


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    """Hydra entry point: resolve the config and run the point."""
    hydra_cfg = HydraConfig.get()
    cfg.sweep_dir = output_dir(cfg.sweep_dir, hydra_cfg)
    return run_point(OmegaConf.to_container(cfg, resolve=True), hydra_provenance(hydra_cfg))


if __name__ == "__main__":  # the `scaling run` command: its exit status says whether a point failed
    import sys

    from scaling.cli import main as cli_main

    sys.exit(cli_main(["run", *sys.argv[1:]]))
