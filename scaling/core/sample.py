"""The pre-screen's sample: which points predicted not to fit run anyway (launch.prescreen_sample), to measure
how often the pre-screen is wrong. A pure hash of the job key, so a re-run samples the same points and the
store (scaling.store.record.answers) and the predictor (scaling.predictor.prescreen.prescreen) agree."""

from __future__ import annotations


def sampled(key: str, fraction: float) -> bool:
    """Whether a point the pre-screen would skip runs anyway, as part of a `fraction` sample: decided by its
    job key, so a re-run samples the same points."""
    return int(key, 16) % 10_000 < round(fraction * 10_000)
