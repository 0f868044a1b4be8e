"""Keys of a Hugging Face config file that nothing reads: transformers keeps a key its config class does not know as
an attribute and builds the model without it (a misspelt `intermediate_sise` leaves `intermediate_size` at its
default, silently another model), so such a key is refused before anything runs, naming the key and the fields it
could mean. Known is what the config class declares (its fields and `attribute_map`), and a key that transformers'
code for the model type, or its shared config, rope and modeling code, names: modeling code reads some keys its
config class does not declare (`getattr(config, "head_dim", ...)` in Qwen3-MoE), and older names are converted
(`rope_theta`, `rope_scaling`).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import re
from pathlib import Path
from typing import Any, Iterable

SHARED = (
    "configuration_utils",
    "modeling_utils",
    "modeling_rope_utils",
    "masking_utils",
    "generation.configuration_utils",
)
"""transformers' modules, beside the model type's own, whose naming of a key makes it known."""


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).read_text() if spec is not None and spec.origin else ""


@functools.lru_cache(maxsize=64)
def _named_in(config_module: str) -> frozenset[str]:
    """The identifiers the model type's configuration and modeling modules and the shared ones name."""
    package = config_module.rpartition(".")[0]
    leaf = config_module.rpartition(".")[2].replace("configuration_", "modeling_")
    text = "\n".join(_source(m) for m in (config_module, f"{package}.{leaf}", *(f"transformers.{s}" for s in SHARED)))
    return frozenset(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


@functools.lru_cache(maxsize=64)
def declared(config_class: type) -> frozenset[str]:
    """What a config class declares: its fields (as its default instance writes them) and `attribute_map`'s names."""
    return frozenset(config_class().to_dict()) | frozenset(getattr(config_class, "attribute_map", {}))


def unread(config_class: type, keys: Iterable[str]) -> dict[str, list[str]]:
    """Each of `keys` that `config_class` does not declare and no code of its model type names, with the declared
    fields it could mean (closest first)."""
    fields = declared(config_class)
    named = _named_in(config_class.__module__)
    return {
        key: difflib.get_close_matches(key, sorted(fields), n=2, cutoff=0.75)
        for key in keys
        if key not in fields and key not in named
    }


def unread_line(where: str, config_class: type, found: dict[str, list[str]]) -> str:
    """One line naming the unread keys of `where` (a file, or the model file's overrides) and what each could mean."""
    said = [
        f"{k!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else "") for k, close in found.items()
    ]
    return (
        f"{where}: {', '.join(said)} {'is' if len(said) == 1 else 'are'} not a field of {config_class.__name__} and "
        "no code of transformers' for it reads it: transformers would build the model without it; correct or remove it"
    )


def check_keys(where: str, config_class: Any, fields: dict[str, Any]) -> list[str]:
    """The refusals (one line each, none when all is known) of a file's or an override's keys, and of each composite
    part's (`text_config: {...}`) against its own class."""
    lines = []
    found = unread(config_class, fields)
    if found:
        lines.append(unread_line(where, config_class, found))
    from transformers import CONFIG_MAPPING

    for part, part_class in (getattr(config_class, "sub_configs", None) or {}).items():
        values = fields.get(part)
        if isinstance(values, dict) and values.get("model_type") in CONFIG_MAPPING:  # a part of any type: AutoConfig
            part_class = CONFIG_MAPPING[values["model_type"]]
        if isinstance(values, dict) and hasattr(part_class, "attribute_map"):
            found = unread(part_class, values)
            if found:
                lines.append(unread_line(f"{where} {part}", part_class, found))
    return lines
