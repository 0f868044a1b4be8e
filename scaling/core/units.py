"""Byte units, named once: `GIB` and `MIB`, the unit a set of sizes reads best in (`memory_unit`), and
one size as text (`format_bytes`). Standard library only, so every layer, the ranks
included, uses these."""

from __future__ import annotations

from typing import Optional

KIB, MIB, GIB = 1024, 1024**2, 1024**3


def memory_unit(max_bytes: float) -> tuple[str, int]:
    """The unit for sizes up to `max_bytes`: ('GiB', GIB) from a GiB up, else ('MiB', MIB) (tiny CPU
    models read in MiB). One unit per table column or figure axis."""
    return ("GiB", GIB) if max_bytes >= GIB else ("MiB", MIB)


def format_bytes(n: Optional[float]) -> str:
    """One size as text, in the unit `memory_unit` picks for it: 2.5 MiB, 10.0 GiB; '-' for None."""
    if n is None:
        return "-"
    unit, size = memory_unit(abs(n))
    return f"{n / size:.1f} {unit}"
