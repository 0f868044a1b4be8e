"""Lease holders that live but do not progress: a process stopped (SIGSTOP, a suspended terminal, a debugger's trap)
whose own processes (a launch's torchrun and ranks, which run in sessions of their own and go on when only the
driver's group is stopped) use no CPU either. A waiter notes since when it has seen each such holder so, and goes
past one only once it has been so for launch.stalled_wait_s (scaling.launch.devices.lease)."""

from __future__ import annotations

import time
from typing import Optional

import psutil

IDLE_CPU_S = 0.5
"""CPU-seconds a stopped holder's processes may use, all together, while it is seen stalled: more, and its launch
still runs (it is seen anew)."""

_SEEN: dict[tuple[int, float], tuple[float, float]] = {}
"""(pid, start time) of each holder seen stopped: since when (monotonic) and its processes' CPU-seconds then."""


def stalled_for_s(pid: int) -> Optional[float]:
    """Seconds this process has seen process `pid` stopped with its processes idle (0.0 at the first look); None
    while it runs, or when it is gone."""
    try:
        holder = psutil.Process(pid)
        if holder.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            return None
        key, family = (pid, holder.create_time()), holder.children(recursive=True)
    except psutil.Error:
        return None
    busy = 0.0
    for process in family:
        try:
            busy += sum(process.cpu_times()[:2])
        except psutil.Error:  # gone, or a zombie its stopped parent has not reaped: it runs no more
            continue
    now = time.monotonic()
    since, then = _SEEN.get(key, (now, busy))
    if busy - then > IDLE_CPU_S:  # its launch still works: stalled from now on at the earliest
        since, then = now, busy
    _SEEN[key] = (since, then)
    return now - since
