"""Noise in a measurement: the one spread statistic, and when two figures are within each other's band.

Every spread in records, reports and searches is the relative half-range
`(max - min) / (2 · median)` (`relative_spread`): a figure v with spread s was seen within
v·(1 ± s). Two figures tie, one rule for the heatmaps, the report, Optuna and the recipe, when either lies
within the other's band (`tied`; `within_noise` for relative bands): neither figure then rules out the other.
A record states its band as `metrics.noise_band_frac`; it applies to the figures that move with
the step time (`THROUGHPUT_KEYS`), not to memory.

Standard library only: the analysis and the Optuna sweeper use it without importing torch.
"""

from __future__ import annotations

import statistics
from typing import Sequence

THROUGHPUT_KEYS = ("tokens_per_s", "tokens_per_s_per_gpu", "mfu", "hfu", "step_time_s")
"""Record metrics that move together with the step time, so the noise band applies to each of them."""
NOISE_BAND_KEY = "noise_band_frac"
"""The record metric that holds a point's band: the larger of its within-run and repeat-to-repeat spread."""


def relative_spread(values: Sequence[float]) -> float:
    """The relative half-range (max - min) / (2 · median) of positive values; 0 for one value."""
    if not values:
        raise ValueError("relative_spread needs at least one value")
    middle = statistics.median(values)
    if middle <= 0:
        raise ValueError(f"relative_spread of {list(values)}: the median must be > 0")
    return (max(values) - min(values)) / (2.0 * middle)


def tied(a: float, a_low: float, a_high: float, b: float, b_low: float, b_high: float) -> bool:
    """The one tie rule: figures a and b (with their bands [low, high]) cannot be told apart when either lies within
    the other's band. (Bands that merely overlap would tie figures two half-widths apart: a predicted ±24% band
    would call an option 40% slower even.)"""
    return b_low <= a <= b_high or a_low <= b <= a_high


def within_noise(a: float, band_a_frac: float, b: float, band_b_frac: float) -> bool:
    """`tied` for figures with relative bands v·(1 ± band)."""
    return tied(
        a, a * (1.0 - band_a_frac), a * (1.0 + band_a_frac), b, b * (1.0 - band_b_frac), b * (1.0 + band_b_frac)
    )
