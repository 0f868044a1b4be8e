"""Argument types shared by the commands."""

from __future__ import annotations

import argparse
import re

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_count(text: str) -> int:
    """'4M' -> 4_000_000, '4Mi' -> 4_194_304, '1T' -> 10^12, '2048' -> 2048 (decimal and binary suffixes)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]i?)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: use e.g. 4096, 4M (10^6), 4Mi (2^20) or 1T (10^12)")
    value = float(match.group(1)) * _SUFFIXES[(match.group(2) or "").lower()]
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole count")
    return int(value)
