"""`scaling status SWEEP_DIR [--watch] [--json]`: where a sweep stands, from another shell."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from scaling.store.record import SWEEP_INDEX
from scaling.sweep.standing import Store, render


def main(argv: Optional[list[str]] = None) -> int:
    """`scaling status`: print a sweep directory's status (once, or redrawn with --watch)."""
    p = argparse.ArgumentParser(prog="scaling status", description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument("sweep_dir", type=Path, help="the sweep's directory (sweep_dir, runs/<sweep> by default)")
    p.add_argument("--watch", nargs="?", type=float, const=5.0, metavar="SECONDS", help="redraw every SECONDS (5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    store = Store(a.sweep_dir)
    try:
        while True:
            status = store.look()
            now = dt.datetime.now(dt.timezone.utc)
            if status is None:
                text = (
                    f"scaling status: {a.sweep_dir} holds no sweep yet (no {SWEEP_INDEX}, no records, nothing "
                    f"running): start one with `scaling sweep NAME sweep_dir={a.sweep_dir}`"
                )
            elif a.json:
                text = json.dumps(asdict(status), indent=2)
            else:
                text = "\n".join(render(status, now))
            if a.watch is None:
                print(text, file=sys.stderr if status is None else sys.stdout)
                return 1 if status is None else 0
            if sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")
            print(f"{text}\n(every {a.watch:g} s, Ctrl-C to stop; {now.strftime('%H:%M:%S')} UTC)", flush=True)
            time.sleep(a.watch)
    except KeyboardInterrupt:
        return 0
