"""Which records the analysis can use: a record's consistency, checked once as `collect` reads it.

A store may hold records the analysis cannot use: written by an older schema, edited by hand, merged from
another store, or with derived fields that disagree with their config (a global batch that is not
mbs × grad_acc × dp). One such record must not take the report down; `record_problem` says in one line
what is wrong with it (the field, its value and what would agree), and `collect` leaves it out and names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from scaling.core.enums import Status, ZeroStage
from scaling.core.layout import Layout
from scaling.core.schema import EXPERIMENT_GROUPS


@dataclass(frozen=True)
class LeftOut:
    """A record the analysis cannot use."""

    job_key: str
    """Its job key as the record states it (`?` when it has none)."""
    why: str
    """What is wrong with it, in one line (`record_problem`)."""

    def line(self) -> str:
        """The warning line: `left out <job_key>: <why>`."""
        return f"left out {self.job_key}: {self.why}"


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _config_problems(train: dict[str, Any], parallel: dict[str, Any]) -> list[str]:
    """The config axes the analysis reads: whole, positive, a known ZeRO stage."""
    problems = [
        f"config.{name}={value!r} is not a positive integer"
        for name, value in (
            ("train.seq_len", train.get("seq_len")),
            ("train.mbs", train.get("mbs")),
            ("parallel.dp", parallel.get("dp")),
        )
        if not _positive_int(value)
    ]
    if parallel.get("zero_stage") not in set(ZeroStage):
        problems.append(
            f"config.parallel.zero_stage={parallel.get('zero_stage')!r} is not one of "
            f"{', '.join(str(int(s)) for s in ZeroStage)}"
        )
    grad_acc = train.get("grad_acc")
    if grad_acc != "auto" and not _positive_int(grad_acc):
        problems.append(f"config.train.grad_acc={grad_acc!r} is not a positive integer or 'auto'")
    return problems


def _derived_problems(derived: dict[str, Any], train: dict[str, Any], parallel: dict[str, Any]) -> list[str]:
    """The batch arithmetic of `derived` against the config it was derived from."""
    seq_len, mbs, dp = train["seq_len"], train["mbs"], parallel["dp"]
    grad_acc, gbs, world = derived.get("grad_acc"), derived.get("gbs"), derived.get("world_size")
    bad = [
        f"derived.{name}={value!r} is not a positive integer"
        for name, value in (("grad_acc", grad_acc), ("gbs", gbs), ("world_size", world))
        if not _positive_int(value)
    ]
    if bad:
        return bad
    problems = []
    layout = Layout.of(parallel)
    if world != layout.world_size:  # the world as its degrees' product: config.parallel.dp=2 x parallel.tp=2 = 4
        problems.append(f"derived.world_size={world} disagrees with config.{layout.ranks()}")
    if train["grad_acc"] != "auto" and grad_acc != train["grad_acc"]:
        problems.append(f"derived.grad_acc={grad_acc} disagrees with config.train.grad_acc={train['grad_acc']}")
    if gbs != mbs * grad_acc * dp:
        problems.append(
            f"derived.gbs={gbs} is not mbs × grad_acc × dp = {mbs} × {grad_acc} × {dp} = {mbs * grad_acc * dp}"
        )
    if derived.get("gbs_tokens") is not None and derived["gbs_tokens"] != gbs * seq_len:
        problems.append(
            f"derived.gbs_tokens={derived['gbs_tokens']!r} is not gbs × seq_len = {gbs} × {seq_len} = {gbs * seq_len}"
        )
    for name, asked, got in (("gbs", train.get("gbs"), gbs), ("gbs_tokens", train.get("gbs_tokens"), gbs * seq_len)):
        if asked is not None and asked != got:
            problems.append(f"config.train.{name}={asked!r} but the record derived {got}")
    return problems


def record_problem(record: Any) -> Optional[str]:
    """Why the analysis cannot use a record, in one line; None when it can."""
    if not isinstance(record, dict):
        return f"not a record: a JSON {type(record).__name__}, not an object"
    status = record.get("status")
    if status not in {s.value for s in Status}:
        return f"status={status!r} is not one of {', '.join(s.value for s in Status)}"
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    missing = [g for g in EXPERIMENT_GROUPS if not isinstance(config.get(g), dict)]
    if missing:
        return f"config lacks {', '.join(missing)} (an experiment config has {', '.join(EXPERIMENT_GROUPS)})"
    if status == Status.INVALID:  # counted, never measured: its config may well be impossible (that is why)
        return None
    train, parallel = config["train"], config["parallel"]
    problems = _config_problems(train, parallel)
    if problems:
        return "; ".join(problems)
    derived = record.get("derived")
    if derived is None:
        return (
            "derived=null: a point that passed validation records its batch arithmetic" if status == Status.OK else None
        )
    if not isinstance(derived, dict):
        return f"derived={derived!r} is not an object"
    problems = _derived_problems(derived, train, parallel)
    if status == Status.OK:
        metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
        problems += [
            f"status ok but metrics.{name}={metrics.get(name)!r} is not a positive number"
            for name in ("tokens_per_s_per_gpu", "step_time_s")
            if not _positive_number(metrics.get(name))
        ]
        if not _positive_int(derived.get("n_params")):
            problems.append(f"status ok but derived.n_params={derived.get('n_params')!r} is not a positive integer")
    return "; ".join(problems) or None
