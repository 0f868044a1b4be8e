"""Hydra registration, called by every entry point before it composes a config: the experiment schema
(`experiment_schema`, listed first in conf/config.yaml's defaults) and the resolvers the launcher configs
read (conf/hydra/launcher/slurm.yaml, parallel.yaml). Nothing registers itself on import."""

from __future__ import annotations

from scaling.core.schema import ExperimentConfig, ModelConfig
from scaling.launch import devices, slurm

LLAMA_SCHEMA = "llama_schema"
"""The built-in family's schema in the model group."""


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore: `experiment_schema` (conf/config.yaml lists it first in its
    defaults) and `llama_schema`, the built-in family's, outside the model group so that no one picks it (each preset in
    conf/model/ lists `/llama_schema@_here_` first: a misspelt key or a wrong type fails when Hydra composes; a model
    file without it, a user's `_target_` one, is open)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="experiment_schema", node=ExperimentConfig)
    store.store(name=LLAMA_SCHEMA, node=ModelConfig)


def register() -> None:
    """Register the schema with Hydra's ConfigStore and the launchers' resolvers (idempotent)."""
    register_configs()
    slurm.register_resolvers()
    devices.register_resolvers()
