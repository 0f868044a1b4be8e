"""Where data parallelism stops paying off: the knee of a DP curve (the largest dp before efficiency first falls
below a threshold) and the dps it may lie at within noise. Pure arithmetic."""

from __future__ import annotations

from typing import Optional, Sequence

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
