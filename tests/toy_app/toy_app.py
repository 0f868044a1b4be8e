"""A Hydra app that answers like the engine (a record dict) from a closed form, without torch.

score = 1 - (x - 0.3)^2 + 0.1 * mbs + (0.5 if kind == "b" else 0); mem = 10 * mbs.
mbs above `oom_above_mbs` is an `oom`, `kind == fail_kind` is `failed`. Each call appends one
JSON line (its parameters and hydra.job.num) to `calls_log`, so tests can see what ran; with
SCALING_TEST_GATE set, the call that finds n lines there first stops at the test gate `call<n>`
(scaling.engine.lifetime.gate), so a test holds a trial in flight for as long as it needs.
`mbs_for_kind` is a hydra-optuna-sweeper `custom_search_space` function for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from scaling.engine.lifetime import gate


def score(x: float, mbs: int, kind: str) -> float:
    """The toy objective (higher is better)."""
    return 1.0 - (x - 0.3) ** 2 + 0.1 * mbs + (0.5 if kind == "b" else 0.0)


def mbs_for_kind(cfg: DictConfig, trial: Any) -> None:
    """custom_search_space: mbs depends on the sampled kind (1 or 2 for `a`, 4 or 8 for `b`)."""
    low, high = (1, 2) if trial.params["kind"] == "a" else (4, 8)
    trial.suggest_int("mbs", low, high, step=high - low)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    """Return a record-shaped result for (x, mbs, kind)."""
    if cfg.calls_log:
        logged = Path(cfg.calls_log)
        gate(f"call{len(logged.read_text().splitlines()) if logged.exists() else 0}")
    key = f"x={cfg.x}|mbs={cfg.mbs}|kind={cfg.kind}"
    if cfg.mbs > cfg.oom_above_mbs:
        record: dict[str, Any] = {"status": "oom", "job_key": key, "error": "OutOfMemoryError", "metrics": None}
    elif cfg.kind == cfg.fail_kind:
        record = {"status": "failed", "job_key": key, "error": "RuntimeError: injected", "metrics": None}
    else:
        metrics = {"score": score(cfg.x, cfg.mbs, cfg.kind), "mem": 10.0 * cfg.mbs}
        record = {"status": "ok", "job_key": key, "error": None, "metrics": metrics}
    if cfg.calls_log:
        num = HydraConfig.get().job.get("num")
        with open(cfg.calls_log, "a") as f:
            f.write(json.dumps({"x": cfg.x, "mbs": cfg.mbs, "kind": cfg.kind, "num": num}) + "\n")
    return record


if __name__ == "__main__":
    main()
