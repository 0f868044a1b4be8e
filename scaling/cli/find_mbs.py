"""`scaling find-mbs [overrides] [--max-mbs N] [--analytic] [--no-confirm] [--json]`: the largest micro-batch that
fits, found by prediction and confirmed by at most two runs (scaling.recipe.mbs_search)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Optional

from scaling.core.units import memory_unit
from scaling.core.validate import InvalidConfig
from scaling.predictor import TraceError
from scaling.predictor.calibrated import NO_ANALYTIC
from scaling.recipe.mbs_search import find_mbs


def main(argv: Optional[list[str]] = None) -> int:
    """`scaling find-mbs`: print the largest mbs that fits; exit status 0 when one was found."""
    p = argparse.ArgumentParser(
        prog="scaling find-mbs",
        description="The largest micro-batch that fits, found by prediction and confirmed by at most two runs.",
    )
    p.add_argument("--max-mbs", type=int, default=1024, help="largest mbs considered (default 1024)")
    p.add_argument(
        "--analytic",
        action="store_true",
        help="predict with the analytic model only, calibrated by traces of 1 and 2 blocks for a model it describes "
        "(no whole-model trace; a model it does not describe is traced all the same)",
    )
    p.add_argument("--no-confirm", action="store_true", help="do not run the two confirming points")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object (peaks in bytes)")
    p.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. model=small train.seq_len=256 hardware.memory_gb=0.05"
    )
    a = p.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if a.max_mbs < 1:
        p.error(f"--max-mbs={a.max_mbs} must be >= 1")
    from scaling.sweep.compose import compose_config

    try:
        result = find_mbs(compose_config(a.overrides), a.max_mbs, traced=not a.analytic, confirm=not a.no_confirm)
    except (ValueError, InvalidConfig) as e:
        print(f"scaling find-mbs: {e}", file=sys.stderr)
        return 2
    except TraceError as e:  # the model's own step raised on fake tensors: its ranks may fail so
        print(f"scaling find-mbs: {e}; `scaling run` of a point records what its ranks do", file=sys.stderr)
        return 1
    if a.analytic and result.method == "traced":
        print(f"scaling find-mbs: --analytic: {NO_ANALYTIC}: traced", file=sys.stderr)
    if a.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        capacity = result.capacity_bytes
        unit, div = memory_unit(capacity)  # as `scaling predict` writes it
        for m, peak in result.predictions.items():
            print(
                f"  mbs={m}: predicted {peak / div:.3f} {unit} per rank ({result.method}), {peak / capacity:.0%} of "
                f"the {capacity / div:.3f} {unit} capacity: {'fits' if peak <= capacity else 'does not fit'}"
            )
        for r in result.runs:
            peak = r["peak_mem_bytes"]
            print(
                f"  run mbs={r['mbs']}: {r['status']}"
                + (f", measured peak {peak / div:.3f} {unit} ({peak / capacity:.0%} of the capacity)" if peak else "")
            )
        print(
            f"largest mbs that fits: {result.mbs} (predicted {result.predicted_mbs} by {result.method}; {result.note})"
        )
    return 0 if result.mbs >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
