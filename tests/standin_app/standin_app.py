"""The project's Hydra app (conf/, its sweeper, launchers and progress callback) with a stand-in job, for tests of
the SLURM launcher at a few hundred points, where the point itself is not what is tested.

The job does what run_point does around a launch, and nothing in between: it marks the point running, waits
`STANDIN_SLEEP_S`, and writes an `ok` record (with when it ran and in which SLURM job, for the tests) under the
point's real job key. It never imports torch, so a SLURM task costs Python and Hydra start-up only.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from scaling.core.schema import CONF_DIR, register_configs
from scaling.engine.enums import Status
from scaling.engine.jobfiles import RESULT_FILE, write_json_atomic
from scaling.launch import slurm
from scaling.store import inflight
from scaling.store.record import experiment_config, job_dir, job_key

STANDIN_SLEEP_S = 0.15


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    """Record the point as `ok` after a short sleep, as if it had run."""
    c = OmegaConf.to_container(cfg, resolve=True)
    key = job_key(c)
    jd = job_dir(os.path.abspath(c["sweep_dir"]), key)
    jd.mkdir(parents=True, exist_ok=True)
    inflight.mark_running(jd, os.environ)
    t0 = time.time()
    time.sleep(STANDIN_SLEEP_S)
    record = {"job_key": key, "status": Status.OK, "error": None, "config": experiment_config(c), "metrics": None,
              "timing": {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                         "wall_s": time.time() - t0, "t0": t0, "t1": time.time()},
              "env": {"slurm_job_id": inflight.slurm_job_id(os.environ), "pid": os.getpid()}}
    record["repeats"] = [{"status": Status.OK, "error": None, "metrics": None, "timing": dict(record["timing"])}]  # one ok launch
    write_json_atomic(jd / RESULT_FILE, record)
    inflight.clear(jd)
    return record


register_configs()
slurm.register_resolvers()

if __name__ == "__main__":
    main()
