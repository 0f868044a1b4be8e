"""Where data parallelism stops paying off, one definition for the report and the recipe: the first count whose
efficiency (tokens/s per GPU relative to the baseline) falls below a threshold (`find_knee`'s second value; its first
is the last count that still pays), the counts it may lie at within noise, and the one sentence that says it
(`stops_paying_off`). Pure arithmetic."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

DEFAULT_THRESHOLD = 0.8
"""Efficiency (tokens/s per GPU relative to the smallest dp) below which more DP no longer pays off."""


def find_knee(
    dps: Sequence[int], efficiency: Sequence[float], threshold: float = DEFAULT_THRESHOLD
) -> tuple[int, Optional[int]]:
    """(knee dp, first dp below threshold or None): the knee is the largest dp before efficiency first drops."""
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold={threshold}: an efficiency threshold lies in (0, 1]")
    if len(dps) != len(efficiency) or not dps:
        raise ValueError(f"dps ({len(dps)}) and efficiency ({len(efficiency)}) must be non-empty and of one length")
    if any(b <= a for a, b in zip(dps, dps[1:])):
        raise ValueError(f"dps={list(dps)} must be strictly increasing")
    knee = dps[0]
    for dp, eff in zip(dps, efficiency):
        if eff < threshold:
            return knee, dp
        knee = dp
    return knee, None


def knee_range(
    dps: Sequence[int], efficiency: Sequence[float], noise_frac: Sequence[float], threshold: float = DEFAULT_THRESHOLD
) -> tuple[int, int]:
    """(earliest, latest) knee within noise: the knee of each efficiency pushed down, and up, by its band."""
    low = [e * (1.0 - n) for e, n in zip(efficiency, noise_frac)]
    high = [e * (1.0 + n) for e, n in zip(efficiency, noise_frac)]
    return find_knee(dps, low, threshold)[0], find_knee(dps, high, threshold)[0]


def stops_paying_off(
    first_below: Optional[int], threshold: float, baseline: str, last: int, count: Callable[[int], str]
) -> str:
    """The one sentence: `DP stops paying off at 16 GPUs: the first count whose efficiency falls below 80% of the best
    single GPU`, or `DP keeps paying off up to 64 GPUs: efficiency stays at or above 80% of ...` when no count up to
    `last` falls below. `count` writes a count (`16 GPUs`, `dp=16`); `baseline` names what efficiency is relative to."""
    thr = f"{threshold:.0%}"
    if first_below is None:
        return f"DP keeps paying off up to {count(last)}: efficiency stays at or above {thr} of {baseline}"
    return (
        f"DP stops paying off at {count(first_below)}: the first count whose efficiency falls below {thr} of {baseline}"
    )
