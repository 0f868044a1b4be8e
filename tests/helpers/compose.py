"""Compose the real Hydra config (conf/config.yaml) for tests, shrunk to CPU-sized points."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Sequence

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from scaling.core.schema import CONF_DIR, ExperimentConfig
from scaling.launch.resolvers import register_configs
from scaling.model.family import family_of
from scaling.perf.step_model import Workload
from scaling.sweep.grid import is_value_override
from scaling.sweep.hydra_adapter import apply_overrides

REPO = Path(__file__).resolve().parents[2]


def compose_point(overrides: Sequence[str] = (), sweep_dir: str | Path | None = None) -> ExperimentConfig:
    """The experiment config as `python -m scaling run <overrides>` builds it. As the grid sweeper does
    (scaling.sweep.grid.PointConfigs, which tests/test_grid.py holds to Hydra's full composition): Hydra composes the
    group choices once per process, and the value overrides (`train.mbs=4`) are applied to a copy as Hydra applies
    them after composing; anything else, or a point that fails so, is composed in full (Hydra's own error)."""
    extra = [f"sweep_dir={sweep_dir}"] if sweep_dir is not None else []
    wanted = [*overrides, *extra]
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(CONF_READS_ENV)))
    parsed = [(o, _is_value(o)) for o in map(_parse, wanted)]
    values = [o for o, value in parsed if value]
    base_key = (tuple(o.input_line for o, value in parsed if not value), env)
    try:
        if base_key not in _bases:
            _bases[base_key] = _compose(list(base_key[0]))
        cfg = _bases[base_key].copy()
        apply_overrides(values, cfg)
        return ExperimentConfig.from_dict(OmegaConf.to_container(cfg, resolve=True))
    except Exception:  # Hydra's full composition says what is wrong, with its own error
        return ExperimentConfig.from_dict(OmegaConf.to_container(_compose(wanted), resolve=True))


CONF_READS_ENV = ("WANDB_",)
"""The environment variables conf/ interpolates (`${oc.env:...}` in logger/wandb.yaml): part of a composition's key."""
GROUPS = frozenset(p.name for p in CONF_DIR.iterdir() if p.is_dir() and not p.name.startswith("_"))
"""The config groups of conf/ (model, train, ...): an override of one is a group choice, composed by Hydra."""
_bases: dict[tuple[Any, ...], Any] = {}
_parsed: dict[str, Any] = {}


def _compose(overrides: list[str]) -> Any:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _parse(override: str) -> Any:
    if override not in _parsed:
        (_parsed[override],) = _parser().parse_overrides([override])
    return _parsed[override]


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _is_value(o: Any) -> bool:
    """A value override as the grid sweeper tells it (scaling.sweep.grid.is_value_override), under conf/'s top-level
    groups; a nested group's choice (`hydra/launcher=...`), a sweep or a hydra setting is composed in full."""
    key = o.key_or_group
    return (
        is_value_override(o, GROUPS) and "/" not in key and not o.is_sweep_override() and key.split(".")[0] != "hydra"
    )


def workload_of(cfg: ExperimentConfig | dict[str, Any], grad_acc: int) -> Workload:
    """The step model's workload of one config (a record's `config` read back as one) at its grad_acc."""
    c = cfg if isinstance(cfg, ExperimentConfig) else ExperimentConfig.from_dict(cfg)
    train, parallel = c.train, c.parallel
    return Workload(
        parallel.zero_stage,
        family_of(c.model).shape(train.seq_len),
        train.precision,
        train.mbs,
        train.seq_len,
        None,
        grad_acc,
        parallel.fsdp_grad_reduce,
        train.recompute,
        train.grad_clip,
        parallel.bucket_mb,
        parallel.dp_shard,
        parallel.tp,
    )
