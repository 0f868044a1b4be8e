"""The project's Hydra app (conf/, its sweeper, launchers and progress callback) with a stand-in job, for tests of
what a sweep does around its points (SLURM arrays of a hundred points, progress lines and closing counts, resume,
`scaling status`), where the point itself is not what is tested.

The job does what run_point does around a launch, and nothing in between: it judges the point as run_point does
before launching (invalid; predicted_oom when it has a capacity), marks it running, stops at the test gate
`job<hydra.job.num>` when SCALING_TEST_GATE is set (scaling.engine.lifetime.gate: a test holds a point in flight
for as long as it looks), waits `STANDIN_SLEEP_S`, and writes the record a launch ends in when its ranks do what
`train.fault` asks (ok, oom, failed, timeout), with when it ran and in which SLURM job, under the point's real job
key. Without a capacity it never imports torch, so a SLURM task costs Python and Hydra start-up only.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from scaling.core.enums import Status
from scaling.core.files import write_json_atomic
from scaling.core.schema import CONF_DIR, ExperimentConfig
from scaling.core.validate import InvalidConfig, validate
from scaling.engine.jobfiles import RESULT_FILE
from scaling.engine.lifetime import gate
from scaling.launch import slurm
from scaling.launch.resolvers import register_configs
from scaling.store import inflight
from scaling.store.record import job_dir, job_key

STANDIN_SLEEP_S = 0.15
FAULT_STATUS = {"none": Status.OK, "oom": Status.OOM, "crash": Status.FAILED, "hang": Status.TIMEOUT}
"""The status a launch ends in when its last rank does what `train.fault` asks (see test_engine.py)."""


def judged(c: ExperimentConfig) -> Optional[tuple[str, str]]:
    """What run_point records without launching (invalid, predicted_oom) with the reason; None to launch."""
    if c.hardware.memory_gb is None:  # nothing to pre-screen: validation alone, no torch import
        try:
            validate(c)
        except InvalidConfig as e:
            return Status.INVALID, str(e)
        return None
    from scaling.sweep.grid import LAUNCH, predict_new  # the pre-screen's model imports torch

    forecast = predict_new(c)
    return None if forecast["status"] == LAUNCH else (forecast["status"], forecast["error"] or "predicted")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    """Record the point as its launch would end, after a short sleep, as if it had run."""
    c = ExperimentConfig.from_dict(OmegaConf.to_container(cfg, resolve=True))
    key = job_key(c)
    jd = job_dir(os.path.abspath(c.sweep_dir), key)
    jd.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "job_key": key,
        "config": c.experiment(),
        "metrics": None,
        "predicted": None,
        "repeats": [],
    }
    before_launch = judged(c)
    t0 = time.time()
    if before_launch is None:
        inflight.mark_running(jd, os.environ)
        gate(f"job{HydraConfig.get().job.get('num')}")
        time.sleep(STANDIN_SLEEP_S)
        status = FAULT_STATUS[c.train.fault]
        error = None if status == Status.OK else f"stand-in: train.fault={c.train.fault}"
    else:
        status, error = before_launch
    record.update(
        status=status,
        error=error,
        timing={
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": time.time() - t0,
            "t0": t0,
            "t1": time.time(),
        },
        env={"slurm_job_id": inflight.slurm_job_id(os.environ), "pid": os.getpid()},
    )
    if before_launch is None:  # one launch, as it ended
        record["repeats"] = [{"status": status, "error": error, "metrics": None, "timing": dict(record["timing"])}]
    write_json_atomic(jd / RESULT_FILE, record)
    inflight.clear(jd)
    return record


register_configs()
slurm.register_resolvers()

if __name__ == "__main__":
    main()
