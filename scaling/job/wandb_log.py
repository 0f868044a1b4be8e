"""Weights & Biases logging of one point: the dashboard, never the source of truth.

One run per point and attempt, whatever its status (`predicted_oom` and `invalid` too, with config and
status but no history), so a W&B heatmap has the report's cells. Its id, name, tags, config and summary
are the record's, mapped by scaling.store.wandb_runs (a run is a second copy of the record); this module
adds the run's group (the sweep), job_type `throughput`, and the history `step/…`, one row per timed
step (`step/timed_step` is its x-axis), whose summaries are their min, max and mean (`define_metric`),
never a last step passed off as the headline (`metrics/tokens_per_s_per_gpu` is gbs_tokens / median
step time, per GPU).

Offline by default; any W&B failure is reported on stderr and never fails the point: result.json is
written before this runs.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, Mapping, Optional

from scaling.job.metrics import tokens_per_s
from scaling.store.index import store_id
from scaling.store.wandb_runs import run_config, run_id, run_name, run_tags, summary_of

STEP = "step/timed_step"
"""The x-axis of the per-step history: 0 for the first timed step after warm-up."""


def history_of(record: Mapping[str, Any]) -> list[dict[str, float]]:
    """One `step/…` history row per timed step (none for a point that did not run to the end)."""
    m, d = record.get("metrics") or {}, record.get("derived") or {}
    rows = []
    for step, step_time in enumerate(m.get("step_times_s") or []):
        total, per_gpu = tokens_per_s(d, step_time)
        rows.append(
            {
                STEP: step,
                "step/step_time_s": step_time,
                "step/tokens_per_s": total,
                "step/tokens_per_s_per_gpu": per_gpu,
            }
        )
    return rows


def log_point(record: Mapping[str, Any], logger: Mapping[str, Any], sweep_dir: str) -> Optional[str]:
    """Log a point of the store `sweep_dir` as one W&B run (per attempt); returns the run's directory, or None
    if not logged."""
    if logger["name"] != "wandb":
        return None
    try:
        import wandb

        run = wandb.init(
            project=logger["project"],
            entity=logger["entity"],
            id=run_id(record, store_id(sweep_dir)),
            resume="allow",
            group=record["sweep"],
            job_type="throughput",
            name=run_name(record),
            tags=run_tags(record),
            config=run_config(record),
            dir=logger["dir"] or sweep_dir,
            mode=logger["mode"],
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True),
        )
        try:
            run.define_metric(STEP)
            run.define_metric("step/*", step_metric=STEP, summary="min,max,mean")
            for row in history_of(record):
                run.log(row)
            run.summary.update(summary_of(record))
            return str(run.dir)
        finally:
            run.finish()
    except Exception:
        print(
            f"[scaling] W&B logging failed for {record['job_key']} (the record is kept):\n"
            f"{traceback.format_exc(limit=2)}",
            file=sys.stderr,
        )
        return None
