"""Weights & Biases logging of one point: the dashboard, never the source of truth.

One run per point and attempt, whatever its status, its id, name, tags, config and summary the record's
(scaling.store.wandb_runs); this module adds the group (the sweep), job_type `throughput` and the history
`step/…`, one row per timed step. Offline by default, in the store unless `logger.dir` or `WANDB_DIR` says
otherwise. A W&B failure never fails the point: result.json is written first, and the point's line names it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from scaling.core.derived import Derived
from scaling.core.schema import LoggerConfig
from scaling.job.throughput import tokens_per_s
from scaling.store.index import store_id
from scaling.store.wandb_runs import run_config, run_dir, run_id, run_name, run_settings, run_tags, summary_of

STEP = "step/timed_step"
"""The x-axis of the per-step history: 0 for the first timed step after warm-up."""


def history_of(record: Mapping[str, Any]) -> list[dict[str, float]]:
    """One `step/…` history row per timed step (none for a point that did not run to the end)."""
    m = record.get("metrics") or {}
    rows = []
    for step, step_time in enumerate(m.get("step_times_s") or []):
        total, per_gpu = tokens_per_s(Derived.from_dict(record["derived"]), step_time)
        rows.append(
            {
                STEP: step,
                "step/step_time_s": step_time,
                "step/tokens_per_s": total,
                "step/tokens_per_s_per_gpu": per_gpu,
            }
        )
    return rows


def init_kwargs(
    record: Mapping[str, Any], logger: LoggerConfig, sweep_dir: str, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The arguments of `wandb.init` for a point of the store `sweep_dir` (`settings` as a dict of
    `wandb.Settings` fields), given the process's environment."""
    return {
        "project": logger.project,
        "entity": logger.entity,
        "id": run_id(record, store_id(sweep_dir)),
        "resume": "allow",
        "group": record["sweep"],
        "job_type": "throughput",
        "name": run_name(record),
        "tags": run_tags(record),
        "config": run_config(record),
        "dir": run_dir(logger.dir, sweep_dir, environ),
        "mode": logger.mode,
        "reinit": "finish_previous",
        "settings": run_settings(environ),
    }


def log_point(record: Mapping[str, Any], logger: LoggerConfig, sweep_dir: str) -> Optional[str]:
    """Log a point of the store `sweep_dir` as one W&B run (per attempt); returns why logging failed (one
    line), or None when it was logged or W&B is off."""
    if logger.name != "wandb":
        return None
    try:
        import wandb

        kwargs = init_kwargs(record, logger, sweep_dir, os.environ)
        run = wandb.init(**kwargs | {"settings": wandb.Settings(**kwargs["settings"])})
        try:
            run.define_metric(STEP)
            run.define_metric("step/*", step_metric=STEP, summary="min,max,mean")
            for row in history_of(record):
                run.log(row)
            run.summary.update(summary_of(record))
        finally:
            run.finish()
    except Exception as e:
        return f"W&B logging failed (the record is kept): {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return None
