"""Compose the real Hydra config (conf/config.yaml) for tests, shrunk to CPU-sized points."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis.step_model import Workload
from scaling.core.schema import CONF_DIR, ExperimentConfig
from scaling.launch.resolvers import register_configs

REPO = Path(__file__).resolve().parents[2]


def compose_point(overrides: Sequence[str] = (), sweep_dir: str | Path | None = None) -> ExperimentConfig:
    """The experiment config as `python -m scaling run <overrides>` builds it."""
    register_configs()
    extra = [f"sweep_dir={sweep_dir}"] if sweep_dir is not None else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, *extra])
    return ExperimentConfig.from_dict(OmegaConf.to_container(cfg, resolve=True))


def workload_of(cfg: ExperimentConfig | dict[str, Any], grad_acc: int) -> Workload:
    """The step model's workload of one config (a record's `config` read back as one) at its grad_acc."""
    c = cfg if isinstance(cfg, ExperimentConfig) else ExperimentConfig.from_dict(cfg)
    train, parallel = c.train, c.parallel
    return Workload(
        parallel.zero_stage,
        c.model,
        train.precision,
        train.mbs,
        train.seq_len,
        None,
        grad_acc,
        parallel.fsdp_grad_reduce,
        train.recompute,
        train.grad_clip,
        parallel.bucket_mb,
    )
