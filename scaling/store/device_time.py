"""Device time: what the device-seconds held by a store's launches went to.

A launch holds its devices (its world size) for torchrun's wall time: `device_s` device-seconds, which an ok
launch splits into its timed steps, its warm-up and the rest, start-up and teardown (scaling.store.record.
LaunchTiming); a record's `timing` sums them over every launch it holds. `total` adds records up; what is left of
`device_s` went to launches that did not end ok (oom, timeout, failed). `scaling status` and the report state
these totals. Launches a re-run dropped from a record (failed ones, or all with launch.rerun=all) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

SPLIT = ("timed_device_s", "warmup_device_s", "startup_device_s")
"""The parts of an ok launch's device_s, as LaunchTiming and Timing name them."""


@dataclass
class DeviceTime:
    """Device-seconds held by a set of records' launches, by what they went to."""

    device_s: float = 0.0
    """Device-seconds held: torchrun's wall time × the devices of each launch."""
    timed_device_s: float = 0.0
    """In the timed steps: what measured throughput."""
    warmup_device_s: float = 0.0
    """In the warm-up steps."""
    startup_device_s: float = 0.0
    """In start-up and teardown: imports, process group, model build, the timed steps' batches, exit."""
    not_ok_device_s: float = 0.0
    """In launches that did not end ok (oom, timeout, failed): device_s less the three parts above."""
    timed_frac: Optional[float] = None
    """timed_device_s / device_s: the share of the device time that measured; None when none was held."""
    records: int = 0
    """Records that say how much device time they held."""
    unknown: int = 0
    """Records that ran torchrun but were written before device time was kept: not counted."""

    def frac(self, seconds: float) -> Optional[float]:
        """`seconds` as a share of the device time held; None when none was held."""
        return seconds / self.device_s if self.device_s > 0 else None

    def held(self) -> str:
        """`0.426 device-h held by 44 points: 7.3% in timed steps, ...`, and the records not counted if any."""
        unknown = f" ({self.unknown} more recorded before device time was kept)" if self.unknown else ""
        return f"{device_hours(self.device_s)} held by {self.records} points: {self.shares()}{unknown}"

    def shares(self) -> str:
        """`8.1% in timed steps, 4.9% warm-up, 80.0% start-up, 7.0% launches not ok` (start-up: and teardown)."""
        if self.device_s <= 0:
            return "no device time recorded"
        parts = [
            (self.timed_device_s, "in timed steps"),
            (self.warmup_device_s, "warm-up"),
            (self.startup_device_s, "start-up"),
            (self.not_ok_device_s, "launches not ok"),
        ]
        return ", ".join(f"{self.frac(seconds):.1%} {what}" for seconds, what in parts)


def total(timings: Iterable[Mapping[str, Any]]) -> DeviceTime:
    """The device time of records, from their `timing` blocks (or any mappings with the same keys)."""
    out = DeviceTime()
    for timing in timings:
        if timing.get("device_s") is None:
            out.unknown += timing.get("torchrun_wall_s") is not None
            continue
        out.records += 1
        out.device_s += timing["device_s"]
        for part in SPLIT:
            setattr(out, part, getattr(out, part) + (timing.get(part) or 0.0))
    out.not_ok_device_s = max(0.0, out.device_s - sum(getattr(out, part) for part in SPLIT))
    out.timed_frac = out.frac(out.timed_device_s)
    return out


def device_hours(seconds: float) -> str:
    """Device-seconds as device-hours, three significant figures: 44.3 -> '0.0123 device-h'."""
    hours = seconds / 3600
    return f"{hours:,.0f} device-h" if hours >= 100 else f"{hours:.3g} device-h"
