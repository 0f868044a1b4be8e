"""Hydra registration, called by every entry point before it composes a config: the experiment schema
(`experiment_schema`, listed first in conf/config.yaml's defaults) and the resolvers the launcher configs
read (conf/hydra/launcher/slurm.yaml, parallel.yaml). Nothing registers itself on import."""

from __future__ import annotations

from scaling.core.schema import ExperimentConfig
from scaling.launch import devices, slurm


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore; conf/config.yaml lists it first in its defaults."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="experiment_schema", node=ExperimentConfig)


def register() -> None:
    """Register the schema with Hydra's ConfigStore and the launchers' resolvers (idempotent)."""
    register_configs()
    slurm.register_resolvers()
    devices.register_resolvers()
