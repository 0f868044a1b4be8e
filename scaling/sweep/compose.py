"""Composing configs outside a Hydra run: one point's config (`scaling predict`, `find-mbs`, `collectives`)
and a sweep file's grid with its points' configs (`scaling predict --sweep`, the dry run's tests)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from scaling.core import schema
from scaling.core.model_group import closest_field
from scaling.core.schema import CONF_DIR, ExperimentConfig, UnknownKey, config_dirs, searchpath_override
from scaling.launch.resolvers import register
from scaling.sweep.grid import PointConfigs, expand


class ComposeError(ValueError):
    """Overrides that do not compose (an unknown config choice, key or type), said in one line."""


def compose_config(overrides: Sequence[str] = (), sweep_file: Optional[Path] = None) -> ExperimentConfig:
    """The config of `scaling run <overrides>` (or of the sweep file's base point); overrides that do not compose
    raise ComposeError, which names the valid choices of an unknown one."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return ExperimentConfig.from_dict(_resolve(_compose(overrides, sweep_file)))
    except (HydraException, OmegaConfBaseException, UnknownKey) as e:
        raise ComposeError(refusal_line(e)) from e


def refusal_line(e: BaseException) -> str:
    """One line for an error of composing a config (Hydra's, OmegaConf's or the schema's UnknownKey): what OmegaConf
    said beneath Hydra's words, and an unknown config choice with the group's valid ones."""
    lines, inner = str(e).strip().splitlines(), e.__cause__
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:  # Hydra's "... raised while composing config:", what it was beneath
        text = f"{text} {lines[1].strip()}"
        group = re.search(r"is not a subclass of (\w+)Config\. value: (\S+)", text)
        if group:  # a group set as a plain key (`logger: none` in a sweep file): the line that chooses it
            name = group.group(1).lower()
            text += f" (a config group's choice goes in the defaults list: `- override /{name}: {group.group(2)}`)"
    while inner is not None and inner.__cause__ is not None:
        inner = inner.__cause__
    if inner is not None:  # what OmegaConf said: the key the group lacks, the value its type refuses
        text = f"{text.rstrip('.')}: {str(inner).strip().splitlines()[0]}"
        node, key = getattr(inner, "parent_node", None), getattr(inner, "key", None)
        if "is not in struct" in text and node is not None and isinstance(key, str):
            # a key a model file of one's own does not have (model.d_modle): the key it could mean, else its keys
            keys = [str(k) for k in node if not str(k).startswith("_")]
            near = closest_field(key, keys)
            append = re.search(r"use (\+\S+)", str(e))  # Hydra's own hint: the override that adds the key
            added = f"; {append.group(1)} adds it" if append else ""
            text += f" (did you mean {near!r}?)" if near else f" (its keys: {', '.join(keys)}{added})"
    missing = re.search(r"Could not find '(\w+)/([^']+)'", text)
    if missing:
        group = missing.group(1)
        names = sorted({f.stem for d in config_dirs() for f in (d / group).glob("*.yaml")})
        text = f"{group}={missing.group(2)} is not a config of group {group!r}: valid are {', '.join(names)}"
    unknown = re.search(r"Key '(\w+)' not in '(\w+Config)'", text)
    if unknown:  # a misspelt field of the typed config (train.seqlen): the field it could mean
        group = getattr(schema, unknown.group(2), None) or ExperimentConfig
        near = closest_field(unknown.group(1), (f.name for f in dataclasses.fields(group)))
        text += f" (did you mean {near!r}?)" if near else ""
    return text


def _compose(overrides: Sequence[str], sweep_file: Optional[Path]) -> Any:
    from hydra import compose, initialize_config_dir

    register()
    # the shipped configs first, the project's own conf/ beside them; a sweep file's `defaults: [config, ...]` finds
    # both on the search path
    config_dir, name = (str(CONF_DIR), "config") if sweep_file is None else (str(sweep_file.parent), sweep_file.stem)
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return compose(config_name=name, overrides=[searchpath_override(), *overrides])


def _resolve(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(cfg, resolve=True)
    out.pop("hydra", None)
    return out


@contextlib.contextmanager
def sweep_file_grid(sweep_file: Path, overrides: Sequence[str] = ()) -> Iterator[tuple[list[list[str]], PointConfigs]]:
    """The points of a sweep file's grid (`hydra.sweeper.params` and the command line's overrides)
    and their configs, outside a Hydra run; hydra.* overrides go to the primary config as in a run."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    register()  # the launcher configs read the resolvers
    hydra_overrides = [o for o in overrides if o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    task = [o for o in overrides if o not in hydra_overrides]
    with initialize_config_dir(config_dir=str(sweep_file.resolve().parent), version_base="1.3"):
        master = compose(
            sweep_file.stem,
            overrides=[searchpath_override(), *hydra_overrides],
            return_hydra_config=True,
        )
        params = OmegaConf.to_container(master.hydra.sweeper.params) or {}
        yield expand(params, task), PointConfigs(GlobalHydra.instance().config_loader(), master)
