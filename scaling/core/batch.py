"""Global-batch arithmetic: gbs = mbs x grad_acc x dp, and the Ultra-Scale Playbook's recipe.

The recipe fixes the global batch first (in tokens), then seq_len, the largest mbs that fits and
the available dp, and derives grad_acc. Everything here is pure and needs no process group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


class BatchError(ValueError):
    """A global batch that cannot be split as asked; the message says what would work."""


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def target_gbs_samples(seq_len: int, gbs: Optional[int], gbs_tokens: Optional[int]) -> int:
    """The global batch in samples from train.gbs or train.gbs_tokens (exactly one must be set)."""
    if gbs is not None and gbs_tokens is not None:
        if gbs * seq_len != gbs_tokens:
            raise BatchError(
                f"train.gbs={gbs} and train.gbs_tokens={gbs_tokens} disagree at seq_len={seq_len} "
                f"(gbs x seq_len = {gbs * seq_len}): set only one of them"
            )
        return gbs
    if gbs is not None:
        return gbs
    if gbs_tokens is None:
        raise BatchError("train.grad_acc=auto needs train.gbs or train.gbs_tokens to derive it from")
    if gbs_tokens % seq_len:
        lo, hi = (gbs_tokens // seq_len) * seq_len, (gbs_tokens // seq_len + 1) * seq_len
        raise BatchError(
            f"train.gbs_tokens={gbs_tokens} is not a multiple of train.seq_len={seq_len}: "
            f"try gbs_tokens in {{{lo}, {hi}}}"
            if lo
            else f"train.gbs_tokens={gbs_tokens} is smaller than train.seq_len={seq_len}: try gbs_tokens={hi}"
        )
    return gbs_tokens // seq_len


def nearest_whole_batch(gbs_tokens: int, seq_len: int) -> int:
    """The global batch in samples nearest to `gbs_tokens` (halves round up): what the recipe runs when the batch
    asked for is not a whole number of sequences. A batch below one sequence is refused."""
    if gbs_tokens < seq_len:
        raise BatchError(f"gbs_tokens={gbs_tokens} is smaller than train.seq_len={seq_len}: try gbs_tokens={seq_len}")
    return (2 * gbs_tokens + seq_len) // (2 * seq_len)


def derive_grad_acc(gbs: int, mbs: int, dp: int) -> int:
    """grad_acc = gbs / (mbs x dp), which must be a whole number >= 1; the error proposes choices."""
    per_step = mbs * dp
    if gbs % per_step == 0 and gbs >= per_step:
        return gbs // per_step
    valid_dp = [d for d in divisors(gbs) if (gbs // d) % mbs == 0]
    valid_mbs = [m for m in divisors(gbs) if (gbs // m) % dp == 0]
    why = "below 1" if gbs < per_step else "not a whole number"
    raise BatchError(
        f"grad_acc = gbs / (mbs x dp) = {gbs} / ({mbs} x {dp}) = {gbs / per_step:.3g} is {why}: "
        f"with mbs={mbs} try parallel.dp in {_brief(valid_dp)}; "
        f"with dp={dp} try train.mbs in {_brief(valid_mbs)}"
    )


def _brief(values: list[int], limit: int = 8) -> str:
    """Render a set of choices, shortened when long."""
    if not values:
        return "{} (none)"
    shown = ", ".join(map(str, values[:limit]))
    return "{" + shown + (", ..." if len(values) > limit else "") + "}"


@dataclass(frozen=True)
class Plan:
    """The outcome of the batch-size recipe for one (gbs_tokens, seq_len, mbs, gpus)."""

    gbs_tokens_target: int
    seq_len: int
    mbs: int
    gpus: int
    grad_acc_exact: float
    grad_acc: Optional[int]
    effective_gbs_tokens: Optional[int]
    gpus_for_grad_acc_1: float
    alternatives: tuple[tuple[int, int, int], ...]
    """Nearby valid (gpus, grad_acc, effective gbs_tokens), nearest target first."""

    def describe(self) -> str:
        """Human-readable answer, as printed by `scaling plan`."""
        lines = [
            f"target gbs: {self.gbs_tokens_target:,} tokens = {self.gbs_tokens_target / self.seq_len:,.1f} "
            f"samples of seq_len {self.seq_len}",
            f"mbs {self.mbs} x seq {self.seq_len} = {self.mbs * self.seq_len:,} tokens per GPU per micro-step",
            f"grad_acc 1 would need {self.gpus_for_grad_acc_1:,.1f} GPUs",
            f"with {self.gpus} GPUs: grad_acc = {self.grad_acc_exact:.3g}",
        ]
        if self.grad_acc is not None:
            lines.append(f"-> grad_acc={self.grad_acc}, effective gbs {self.effective_gbs_tokens:,} tokens (exact)")
        else:
            reason = "below 1" if self.grad_acc_exact < 1 else "not a whole number"
            lines.append(f"-> grad_acc {self.grad_acc_exact:.3g} is {reason}; nearest valid choices:")
            for gpus, ga, tokens in self.alternatives:
                off = 100 * (tokens - self.gbs_tokens_target) / self.gbs_tokens_target
                lines.append(f"   {gpus} GPUs x grad_acc {ga}: gbs {tokens:,} tokens ({off:+.1f}%)")
        return "\n".join(lines)


def plan(gbs_tokens: int, seq_len: int, mbs: int, gpus: int) -> Plan:
    """The Playbook recipe: grad_acc for a target gbs, or the nearest valid choices when none is exact."""
    for field_name, value in (("gbs_tokens", gbs_tokens), ("seq_len", seq_len), ("mbs", mbs), ("gpus", gpus)):
        if value < 1:
            raise BatchError(f"{field_name}={value} must be a positive integer")
    tokens_per_micro = mbs * seq_len
    exact = gbs_tokens / (tokens_per_micro * gpus)
    whole = exact >= 1 and gbs_tokens % (tokens_per_micro * gpus) == 0
    candidates = set()
    for ga in {max(1, math.floor(exact)), max(1, math.ceil(exact))}:
        candidates.add((gpus, ga))
    # Keep grad_acc at the rounded values and also move the GPU count to the nearest that fits.
    for ga in {max(1, round(exact)), max(1, math.floor(exact)), max(1, math.ceil(exact))}:
        g = gbs_tokens / (tokens_per_micro * ga)
        for gp in {max(1, math.floor(g)), max(1, math.ceil(g))}:
            candidates.add((gp, ga))
    alternatives = sorted(
        ((gp, ga, gp * ga * tokens_per_micro) for gp, ga in candidates),
        key=lambda c: (abs(c[2] - gbs_tokens), c[0] != gpus, c[0]),
    )
    return Plan(
        gbs_tokens_target=gbs_tokens,
        seq_len=seq_len,
        mbs=mbs,
        gpus=gpus,
        grad_acc_exact=exact,
        grad_acc=round(exact) if whole else None,
        effective_gbs_tokens=gbs_tokens if whole else None,
        gpus_for_grad_acc_1=gbs_tokens / tokens_per_micro,
        alternatives=tuple(alternatives[:4]),
    )


def nodes_needed(dp: int, devices_per_node: Optional[int]) -> int:
    """Nodes a point with `dp` ranks spans: 1 when it fits on one node, else dp / devices_per_node."""
    if dp < 1:
        raise ValueError(f"parallel.dp={dp} must be >= 1")
    if devices_per_node is None or dp <= devices_per_node:
        return 1
    if devices_per_node < 1:
        raise ValueError(f"hardware.devices_per_node={devices_per_node} must be >= 1 or null")
    if dp % devices_per_node:
        lo, hi = dp // devices_per_node * devices_per_node, (dp // devices_per_node + 1) * devices_per_node
        raise ValueError(
            f"parallel.dp={dp} spans nodes of hardware.devices_per_node={devices_per_node} but is not a "
            f"multiple of it: a multi-node point uses whole nodes; try dp in {{{lo}, {hi}}}"
        )
    return dp // devices_per_node
