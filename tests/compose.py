"""Compose the real Hydra config (conf/config.yaml) for tests, shrunk to CPU-sized points."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from scaling.core.schema import CONF_DIR, register_configs

REPO = Path(__file__).resolve().parents[1]


def compose_point(overrides: Sequence[str] = (), sweep_dir: str | Path | None = None) -> dict[str, Any]:
    """The resolved experiment config as `python -m scaling run <overrides>` would build it."""
    register_configs()
    extra = [f"sweep_dir={sweep_dir}"] if sweep_dir is not None else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*overrides, *extra])
    return OmegaConf.to_container(cfg, resolve=True)
