"""A grid sweep's points, their resolved configs and job keys, without a Hydra composition per point.

`PointConfigs` composes once per group choice and applies each point's value overrides with Hydra's own function
(scaling.sweep.hydra_adapter), composing in full only what that cannot reproduce; the config, and so the job key,
is the one the point's own job computes (tests/test_grid.py checks every sweep file). `survey` says per point its
key, its stored record and whether the store answers it (scaling.store.record.answers); `Forecast` counts what a
run would do and estimates its wall time (`wall_estimate_s`). The grid sweeper, its dry run and
`scaling predict --sweep` share them.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Sequence

from scaling.core.enums import LAUNCHED, Status
from scaling.core.files import write_text_atomic
from scaling.core.schema import ExperimentConfig
from scaling.model.family import checked, family_of
from scaling.store.read import RecordError, read_record
from scaling.store.record import answers, job_key, output_dir

if TYPE_CHECKING:  # OmegaConf is imported where it is used: `scaling status` reads records only
    from omegaconf import DictConfig

_NOT_PLAIN = object()
"""A value override `PointConfigs._plain` cannot set on a resolved config."""
LAUNCH = "launch"
"""Forecast of a new point that passes validation and the pre-screen: it runs torchrun."""


def expand(params: Mapping[str, Any], arguments: Sequence[str]) -> list[list[str]]:
    """Every point's overrides, in the order and form Hydra's basic sweeper gives its jobs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from scaling.sweep.hydra_adapter import BasicSweeper

    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(arguments))
    (points,) = BasicSweeper.split_arguments(parsed, None)
    return points


def _as_run_main_resolves(cfg: DictConfig) -> dict[str, Any]:
    """The plain config scaling.job.run's main hands to run_point: sweep_dir made the records' folder
    (scaling.store.record.output_dir), then everything but the hydra node resolved."""
    from omegaconf import OmegaConf

    cfg.sweep_dir = output_dir(cfg.sweep_dir, cfg.hydra)
    out: dict[str, Any] = {}
    for key in cfg:
        if key != "hydra":
            node = cfg[key]
            out[str(key)] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    return out


def is_value_override(o: Any, groups: frozenset[str]) -> bool:
    """A parsed override that is a plain `key=value` of a config key (not a choice of one of `groups`, an add, a
    delete, a package or a dict): Hydra applies it to the config after composing the defaults list."""
    from hydra.core.override_parser.types import OverrideType

    return (
        o.type == OverrideType.CHANGE
        and o.package is None
        and o.key_or_group not in groups
        and not isinstance(o.value(), dict)
    )


@dataclass
class _Base:
    """One composition of a group choice: its config (of the hydra node, the records' folder), its config groups,
    and the composition whole (what a job of the group choice receives, before its value overrides)."""

    cfg: DictConfig
    groups: frozenset[str]
    job: DictConfig
    plain: Optional[dict[str, Any]] = None
    """Its config resolved as a job's main resolves it (`_as_run_main_resolves`), once; None where that needs more
    than the config (an interpolation that reads the hydra node) or an interpolation calls a resolver other than
    PLAIN_RESOLVERS."""
    refs: frozenset[str] = frozenset()
    """The keys its interpolations read (`${train.seq_len}`): a value override of one of them, or of a key above or
    below one, changes more than its own key, so such a point is resolved from the composition."""


PLAIN_RESOLVERS = ("oc.env", "now")
"""Resolvers whose value does not depend on the config: a group choice whose interpolations call only these (and read
keys) resolves once for all its points."""
_INTERPOLATION = re.compile(r"\$\{([^${}:]+)(:)?")


def _refs(node: Any) -> Optional[set[str]]:
    """The keys the interpolations in a plain unresolved config read; None when one calls another resolver or reads
    a key relative to its own."""
    if isinstance(node, dict):
        node = list(node.values())
    if isinstance(node, list):
        out: set[str] = set()
        for child in node:
            refs = _refs(child)
            if refs is None:
                return None
            out |= refs
        return out
    if not isinstance(node, str) or "${" not in node:
        return set()
    out = set()
    for name, call in _INTERPOLATION.findall(node):
        name = name.strip()
        if call:
            if name not in PLAIN_RESOLVERS:
                return None
        elif name.startswith(".") or not name:
            return None
        else:
            out.add(name)
    return out


def _reads(refs: frozenset[str], key: str) -> bool:
    """Whether an interpolation reading `refs` reads `key`, a key above it or one below it."""
    return any(r == key or r.startswith(key + ".") or key.startswith(r + ".") for r in refs)


def _copy_plain(node: Any) -> Any:
    """A deep copy of plain containers (dicts and lists of scalars), faster than copy.deepcopy."""
    if isinstance(node, dict):
        return {k: _copy_plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy_plain(v) for v in node]
    return node


class PointConfigs:
    """Resolved configs of a grid's points, composed once per distinct config-group choice."""

    def __init__(self, config_loader: Any, master_config: DictConfig) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.loader = config_loader
        self.master = master_config
        self.groups = frozenset(master_config.hydra.runtime.choices)
        self.parser = OverridesParser.create()
        self._parsed: dict[str, Any] = {}
        self._bases: dict[tuple[str, ...], _Base] = {}
        self._typed: dict[tuple[int, str], Any] = {}
        self._bound: dict[tuple[int, tuple[str, ...]], _Base] = {}
        self.compositions = 0
        """Hydra compositions made so far: one per group choice, plus each point composed in full."""

    def resolved(self, overrides: Sequence[str]) -> dict[str, Any]:
        """The point's resolved config without the hydra node, as its job composes it."""
        from omegaconf.errors import InterpolationResolutionError

        from scaling.sweep.hydra_adapter import apply_overrides

        base, values = self._split(overrides)
        if base is not None:
            plain = self._plain(*self._binding(overrides, base, values))
            if plain is not None:
                return plain
            cfg = base.cfg.copy()
            apply_overrides(values, cfg)
            with contextlib.suppress(InterpolationResolutionError):  # it reads the hydra node: compose in full
                return _as_run_main_resolves(cfg)
        return _as_run_main_resolves(self._compose(list(overrides)))

    def _binding(self, overrides: Sequence[str], base: _Base, values: list[Any]) -> tuple[_Base, list[Any]]:
        """The configuration a point resolves from and the value overrides left to set: where a value override sets
        a key the group choice's interpolations read (`sweep_dir=...` under `hydra.sweep.dir: ${sweep_dir}`), the
        group choice's composition with those values applied and resolved again (once per distinct set of them, as
        the composition path does per point), else the group choice's."""
        if base.plain is None:
            return base, values
        bound = [v for v in values if _reads(base.refs, v.key_or_group)]
        if not bound:
            return base, values
        key = (id(base), tuple(v.input_line for v in bound))
        if key not in self._bound:
            self._bound[key] = self._bind(base, bound)
        return self._bound[key], [v for v in values if v not in bound]

    @staticmethod
    def _bind(base: _Base, bound: list[Any]) -> _Base:
        """`base` with the value overrides `bound` applied (plain: None where they cannot be resolved without the
        hydra node or the composition path is to say why they fail)."""
        from omegaconf.errors import InterpolationResolutionError

        from scaling.sweep.hydra_adapter import apply_overrides

        out = _Base(base.cfg.copy(), base.groups, base.job, None, base.refs)
        try:
            apply_overrides(bound, out.cfg)
        except Exception:
            return out
        with contextlib.suppress(InterpolationResolutionError):
            out.plain = _as_run_main_resolves(out.cfg.copy())
        return out

    def _plain(self, base: _Base, values: list[Any]) -> Optional[dict[str, Any]]:
        """The point resolved from its group choice's resolved config, each value override set as the composition
        types it (found once per override, on a copy of the composition): what `resolved` composes, without a copy
        and a resolution of the whole config per point (10,000 recorded points resumed in 9 s instead of 55). None where that is not
        the same: an override of a key an interpolation reads (or of one above or below it), of the hydra node,
        a value that is itself an interpolation, or a group choice `_Base.plain` does not cover."""
        if base.plain is None:
            return None
        typed = []
        for o in values:
            key = o.key_or_group
            if key.split(".")[0] == "hydra" or _reads(base.refs, key):
                return None
            cache_key = (id(base), o.input_line)
            if cache_key not in self._typed:
                self._typed[cache_key] = self._typed_value(base, o)
            if self._typed[cache_key] is _NOT_PLAIN:
                return None
            typed.append((key.split("."), self._typed[cache_key]))
        out = _copy_plain(base.plain)
        for path, value in typed:
            node = out
            for part in path[:-1]:
                node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                return None
            node[path[-1]] = _copy_plain(value)
        return out

    @staticmethod
    def _typed_value(base: _Base, o: Any) -> Any:
        """The value override `o` gives its key once applied to the composition, resolved and plain; _NOT_PLAIN when
        it cannot be applied alone (the point then takes the composition's path, which says why) or is itself an
        interpolation."""
        from omegaconf import OmegaConf

        from scaling.sweep.hydra_adapter import apply_overrides

        cfg = base.cfg.copy()
        try:
            apply_overrides([o], cfg)
            node = OmegaConf.select(cfg, o.key_or_group, throw_on_missing=True)
            value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception:
            return _NOT_PLAIN
        raw = OmegaConf.to_container(cfg, resolve=False)
        for part in o.key_or_group.split("."):
            raw = raw.get(part) if isinstance(raw, dict) else None
        return _NOT_PLAIN if _refs(raw) != set() else value

    def job_config(self, overrides: Sequence[str]) -> DictConfig:
        """The point's config with its hydra node, equal to what Hydra's `load_sweep_config` composes for its job
        (the task overrides, `hydra.job.override_dirname` and the master's resolver cache included)."""
        from omegaconf import OmegaConf

        from scaling.sweep.hydra_adapter import apply_overrides, get_overrides_dirname

        parsed = [self._parse(o) for o in overrides]
        # a hydra.* override Hydra files under hydra.overrides.hydra, apart from the task's: the point is composed in full
        base, values = (None, []) if any(o.is_hydra_override() for o in parsed) else self._split(overrides)
        if base is None:
            return self._compose(list(overrides))
        cfg = base.job.copy()
        apply_overrides(values, cfg)
        dirname = cfg.hydra.job.config.override_dirname
        cfg.hydra.overrides.task = list(overrides)
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=parsed,
            exclude_keys=dirname.exclude_keys,
            item_sep=dirname.item_sep,
            kv_sep=dirname.kv_sep,
        )
        OmegaConf.copy_cache(from_config=self.master, to_config=cfg)  # `${now:...}` as the master resolved it
        return cfg

    def _split(self, overrides: Sequence[str]) -> tuple[Optional[_Base], list[Any]]:
        """The composition of the point's group choice and its value overrides; no composition (None) when a value
        sets a key that is a config group under that choice (the point is composed in full)."""
        parsed = [self._parse(o) for o in overrides]
        values = [o for o in parsed if self._is_value(o)]
        base = self._base(tuple(o.input_line for o in parsed if not self._is_value(o)))
        return (None if any(v.key_or_group in base.groups for v in values) else base), values

    def _parse(self, override: str) -> Any:
        if override not in self._parsed:
            (self._parsed[override],) = self.parser.parse_overrides([override])
        return self._parsed[override]

    def _is_value(self, o: Any) -> bool:
        return is_value_override(o, self.groups)

    def _base(self, group_overrides: tuple[str, ...]) -> _Base:
        from omegaconf import OmegaConf, open_dict
        from omegaconf.errors import InterpolationResolutionError

        if group_overrides not in self._bases:
            cfg = self._compose(list(group_overrides))
            job = cfg.copy()
            hydra = cfg.hydra
            # Of the hydra node, only what says where the records go (scaling.store.record.output_dir): a copy per
            # point of the whole node would cost more than the point's own config.
            kept = {
                "sweep": {"dir": OmegaConf.to_container(hydra.sweep, resolve=False)["dir"]},
                "mode": hydra.mode,
                "runtime": {"cwd": hydra.runtime.cwd},
            }
            groups = frozenset(hydra.runtime.choices)
            with open_dict(cfg):
                cfg["hydra"] = kept
            base = _Base(cfg, groups, job)
            refs = _refs(OmegaConf.to_container(cfg, resolve=False))
            if refs is not None:
                with contextlib.suppress(InterpolationResolutionError):  # it reads the hydra node
                    base.plain, base.refs = _as_run_main_resolves(cfg.copy()), frozenset(refs | {"sweep_dir"})
            self._bases[group_overrides] = base
        return self._bases[group_overrides]

    def _compose(self, overrides: list[str]) -> DictConfig:
        self.compositions += 1
        return self.loader.load_sweep_config(self.master, overrides)


@dataclass
class GridPoint:
    """One point of a grid and what the record store knows of it."""

    num: int
    """Position in the grid (0-based, the basic sweeper's job order)."""
    overrides: list[str]
    cfg: ExperimentConfig
    """The point's config."""
    key: str
    sweep_dir: Path
    record: Optional[dict[str, Any]]
    done: bool
    """The stored record answers it (scaling.store.record.answers under the point's launch settings)."""
    problem: Optional[RecordError] = None
    """Its record file cannot be read (the point is not run: the file is left as it is)."""


def survey(points: Sequence[Sequence[str]], configs: PointConfigs, set_aside: bool = False) -> Iterator[GridPoint]:
    """Each point of the grid with its job key, its record and whether the store answers it; with `set_aside`
    (a run, not a dry run) a corrupt record is set aside and its point runs again. A record of a newer scaling
    raises NewerRecord."""
    for num, overrides in enumerate(points):
        cfg = ExperimentConfig.from_dict(configs.resolved(overrides))
        key = job_key(cfg)
        sweep_dir = Path(cfg.sweep_dir)
        problem = None
        try:
            record = read_record(sweep_dir, key, set_aside_corrupt=set_aside)
        except RecordError as e:
            record, problem = None, e
        done = answers(record, key, cfg.launch, family_of(cfg.model).code() if record is not None else None)
        yield GridPoint(num, list(overrides), cfg, key, sweep_dir, record, done, problem)


def predict_new(cfg: ExperimentConfig, traced: bool = False) -> dict[str, Any]:
    """What run_point will do with a point it has to run: `invalid`, `predicted_oom` or `launch`, with
    the prediction (`predicted`) or the error, by run_point's own rules. Analytic unless `traced` (the
    pre-screen traces near-capacity points at launch). `unscreened` says why a launch against a capacity has no
    figure here (a model without the closed form, untraced; a failed trace), else None."""
    from scaling.core.validate import InvalidConfig, pipeline_stages, validate
    from scaling.predictor.prescreen import predicted_oom, prescreen

    try:
        grad_acc = validate(cfg).grad_acc
        checked(
            cfg.model, cfg.train.seq_len, cfg.parallel.tp, pipeline_stages(cfg.parallel), cfg.parallel.zero_stage
        )  # the model's contract, as run_point checks it
    except InvalidConfig as e:
        return {"status": Status.INVALID, "error": str(e), "predicted": None, "unscreened": None}
    predicted = prescreen(cfg, grad_acc, trace=traced)
    unscreened = None
    if predicted["peak_mem_bytes"] is None and predicted["capacity_bytes"] is not None and cfg.launch.prescreen:
        unscreened = predicted.get("trace_error") or (
            f"model {cfg.model.name!r} has no closed-form figure: each launch's pre-screen traces it, "
            "`scaling predict --sweep` traces it now"
        )
    return {
        "status": Status.PREDICTED_OOM if predicted_oom(predicted) else LAUNCH,
        "error": None,
        "predicted": predicted,
        "unscreened": unscreened,
    }


@dataclass
class Forecast:
    """What a run of a grid would do, counted before any job starts."""

    points: int = 0
    recorded: Counter = field(default_factory=Counter)
    """Statuses of the points the store answers."""
    new: Counter = field(default_factory=Counter)
    """Forecasts of the points still to run: launch, predicted_oom, invalid."""
    in_flight: int = 0
    """Points still to run that a live job holds (not launched again)."""
    launched_wall_s: list[float] = field(default_factory=list)
    """Wall time of each recorded point that ran torchrun."""
    timeout_s: float = 0.0
    """The longest launch.timeout_s among the points to launch."""
    unscreened: Counter = field(default_factory=Counter)
    """Launches without a figure here, by why (predict_new's `unscreened`)."""

    def add(
        self, point: GridPoint, forecast: Optional[str], in_flight: bool = False, unscreened: Optional[str] = None
    ) -> None:
        """Count one point: recorded, in flight, or new with its forecast (from predict_new: its status and
        `unscreened`)."""
        self.points += 1
        wall = launch_wall_s(point.record)
        if wall is not None:
            self.launched_wall_s.append(wall)
        if point.done:
            self.recorded[point.record["status"]] += 1
        elif in_flight:
            self.in_flight += 1
        else:
            self.new[forecast] += 1
            if forecast == LAUNCH:
                self.timeout_s = max(self.timeout_s, point.cfg.launch.timeout_s)
                if unscreened:
                    self.unscreened[unscreened] += 1

    def wall_s(self, at_once: int) -> Optional[float]:
        """Estimated wall time of the launches (`wall_estimate_s`)."""
        return wall_estimate_s(self.new[LAUNCH], at_once, self.launched_wall_s)

    def lines(self, name: str, at_once: int) -> list[str]:
        """The grid's size and counts, then the wall-time estimate, as printed before a run."""
        new = sum(self.new.values())
        parts = [
            f"{new} new ({self.new[LAUNCH]} to launch, {self.new[Status.PREDICTED_OOM]} predicted_oom, "
            f"{self.new[Status.INVALID]} invalid)",
            f"{sum(self.recorded.values())} recorded" + (f" ({status_list(self.recorded)})" if self.recorded else ""),
        ]
        if self.in_flight:
            parts.append(f"{self.in_flight} in flight")
        head = f"sweep {name}: {self.points} points: " + ", ".join(parts)
        launches = self.new[LAUNCH]
        how = f"{launches} launch{'es' if launches != 1 else ''}, {at_once} at a time"
        estimate = self.wall_s(at_once)
        if not self.new[LAUNCH]:
            wall = "wall time: nothing to launch"
        elif estimate is not None:
            wall = (
                f"wall time: about {format_duration(estimate)} ({how}; median {statistics.median(self.launched_wall_s):.1f} s "
                f"per launched point over {len(self.launched_wall_s)} recorded)"
            )
        else:
            bound = math.ceil(self.new[LAUNCH] / max(1, at_once)) * self.timeout_s
            wall = (
                f"wall time: unknown, no launched point recorded yet; at most {format_duration(bound)} "
                f"({how}, launch.timeout_s={self.timeout_s:g})"
            )
        unscreened = [
            f"{n} of the launches without a memory figure here: {why}" for why, n in self.unscreened.most_common()
        ]
        return [head, *unscreened, wall]


def launch_wall_s(record: Optional[Mapping[str, Any]]) -> Optional[float]:
    """What launching a recorded point cost: its wall time when it ran torchrun; None for a point that
    never launched (predicted_oom, invalid) or a record without one."""
    if record is None or record.get("status") not in LAUNCHED:
        return None
    wall = (record.get("timing") or {}).get("wall_s")
    return None if wall is None else float(wall)


def wall_estimate_s(launches: int, at_once: int, launched_wall_s: Sequence[float]) -> Optional[float]:
    """Estimated wall time of `launches` points run `at_once` at a time: waves of the median wall time of the
    launched points recorded so far (`launch_wall_s`); None before any. `scaling status` estimates the time
    left by it too."""
    if not launched_wall_s:
        return None
    return math.ceil(launches / max(1, at_once)) * statistics.median(launched_wall_s)


def status_list(counts: Mapping[str, int]) -> str:
    """'40 ok, 12 oom': the non-zero counts, in the order of scaling.core.enums.Status."""
    return ", ".join(f"{counts[s]} {s}" for s in Status if counts.get(s))


def format_duration(seconds: float) -> str:
    """12 -> '12 s', 150 -> '2.5 min', 7200 -> '2.0 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def save_multirun(config: DictConfig) -> None:
    """The sweep's config, as Hydra's sweepers keep it, in `<hydra.sweep.dir>/multirun.yaml`: whole or absent."""
    from omegaconf import OmegaConf

    write_text_atomic(Path(config.hydra.sweep.dir) / "multirun.yaml", OmegaConf.to_yaml(config))


def points_at_once(config: DictConfig) -> int:
    """Points the configured launcher runs at once: SLURM's array_parallelism, joblib's n_jobs, else 1."""
    launcher = config.hydra.launcher
    for at_once in ("array_parallelism", "n_jobs"):
        if at_once in launcher and launcher[at_once]:
            return int(launcher[at_once])
    return 1
