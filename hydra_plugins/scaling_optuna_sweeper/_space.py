"""The search space: Hydra override expressions -> Optuna distributions, and back to overrides.

Mapping (the key of each override is the Optuna parameter name):

- `a,b,c` and `choice(a,b,c)` -> CategoricalDistribution
- `range(start, stop, step)` (stop exclusive, as in Hydra) -> IntDistribution with that step
  (FloatDistribution when any bound is a float)
- `interval(low, high)` -> FloatDistribution; `tag(log, ...)` samples on a log scale,
  `tag(int, ...)` or `int(interval(...))` makes it an IntDistribution
- a plain value -> a fixed override added to every trial
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    IntervalSweep,
    Override,
    QuotedString,
    RangeSweep,
)
from hydra.errors import HydraException
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

_PARAM_TYPES = (str, int, float, bool)
_PLAIN_STRING = re.compile(r"[A-Za-z_/][\w./:@%+-]*")
_KEYWORDS = {"true", "false", "null", "inf", "nan"}


@dataclass
class SearchSpace:
    """Distributions to sample plus the overrides every trial shares."""

    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """The task overrides of one trial: the fixed ones, then one per sampled parameter (those a
        custom_search_space function suggested last)."""
        fixed_keys = {o.split("=", 1)[0] for o in self.fixed}
        extra = [name for name in params if name not in self.distributions]
        clash = fixed_keys & set(extra)
        if clash:
            raise ValueError(f"custom_search_space suggested {sorted(clash)}, which hydra.sweeper.params fixes")
        return self.fixed + [f"{name}={format_value(params[name])}" for name in [*self.distributions, *extra]]

    def grid(self) -> dict[str, list[Any]]:
        """Every value of every parameter, for GridSampler; continuous parameters are refused."""
        grid: dict[str, list[Any]] = {}
        for name, dist in self.distributions.items():
            if isinstance(dist, CategoricalDistribution):
                grid[name] = list(dist.choices)
            elif dist.step is not None and not getattr(dist, "log", False):
                n = int(round((dist.high - dist.low) / dist.step)) + 1
                grid[name] = [_snap(dist.low + i * dist.step, dist) for i in range(n)]
            else:
                raise ValueError(
                    f"hydra.sweeper.sampler.name=grid needs discrete parameters, but {name} is "
                    f"continuous ({dist}): use choice(...), a comma list or range(...)"
                )
        return grid


def format_value(value: Any) -> str:
    """A value as Hydra override syntax: true/false, null, numbers in full, strings quoted when
    they would otherwise read as something else."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str) and (not _PLAIN_STRING.fullmatch(value) or value.lower() in _KEYWORDS):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def leaf_overrides(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`{"train": {"mbs": 2}}` -> `["train.mbs=2"]`: one override per leaf of a nested mapping."""
    overrides = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            overrides += leaf_overrides(value, f"{prefix}{key}.")
        else:
            overrides.append(f"{prefix}{key}={format_value(value)}")
    return overrides


def parse_search_space(expressions: Sequence[str], parser: OverridesParser) -> SearchSpace:
    """Build the space from override strings (`key=expression`); later keys replace earlier ones."""
    space = SearchSpace()
    fixed: dict[str, str] = {}
    for override in parser.parse_overrides(list(expressions)):
        key = override.get_key_element()
        space.distributions.pop(key, None)
        fixed.pop(key, None)
        if override.is_sweep_override():
            space.distributions[key] = _distribution(override)
        else:
            fixed[key] = f"{key}={override.get_value_element_as_str()}"
    space.fixed = list(fixed.values())
    return space


def _distribution(override: Override) -> BaseDistribution:
    key = override.get_key_element()
    value = override.value()
    if override.is_choice_sweep():
        choices = [c.text if isinstance(c, QuotedString) else c for c in override.sweep_iterator()]
        bad = [c for c in choices if not isinstance(c, _PARAM_TYPES)]
        if bad:
            raise HydraException(f"{key}: choice values must be str, int, float or bool, got {bad}")
        return CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        values = list(value.range())
        if not values:
            raise HydraException(f"{key}={override.get_value_element_as_str()} is an empty range")
        if all(isinstance(v, int) for v in (value.start, value.stop, value.step)):
            return IntDistribution(int(values[0]), int(values[-1]), step=int(value.step))
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(value.step))
    if isinstance(value, IntervalSweep):
        assert value.start is not None and value.end is not None
        log = "log" in value.tags
        if "int" in value.tags or all(isinstance(v, int) for v in (value.start, value.end)):  # int(interval(..))
            return IntDistribution(int(value.start), int(value.end), log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    raise HydraException(
        f"{key}={override.get_value_element_as_str()}: the sweeper takes choice(...), "
        "a comma list, range(...) or interval(...)"
    )


def _snap(value: float, dist: BaseDistribution) -> float | int:
    """Grid values of a float range without the trailing binary noise (0.30000000000000004)."""
    if isinstance(dist, IntDistribution):
        return int(value)
    digits = max(0, -math.floor(math.log10(dist.step))) + 6
    return round(value, digits)
