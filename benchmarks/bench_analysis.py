"""How long the analysis takes on a large sweep: 10,000 records -> DataFrame -> every heatmap.

Writes 10,000 synthetic records (4 models x 5 seq_len x 5 mbs x 5 grad_acc x 5 dp x 4 ZeRO
stages, every status present) to a temporary sweep directory, then times `collect`, building the
standard heatmaps and writing them to PNG, the report's way (`render_pngs`: one forked process
per core), next to the same figures drawn in one process. Prints the figures; the target is under
10 s for collect + heatmaps on this machine.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.collect import collect
from analysis.facets import default_layout, figure_specs
from analysis.figures import render_pngs
from scaling.core.enums import Status
from scaling.core.host import usable_cores
from scaling.engine.jobfiles import RESULT_FILE
from tests.helpers.records import GIB, make_record, peak_mem_bytes

MODELS = ("tiny", "small", "llama_1b", "llama_3b")
SEQ_LENS = (256, 512, 1024, 2048, 4096)
MBSS = (1, 2, 4, 8, 16)
GRAD_ACCS = (1, 2, 4, 8, 16)
DPS = (1, 2, 4, 8, 16)
ZERO_STAGES = (0, 1, 2, 3)
MEMORY_GB = 24.0


def write_records(sweep_dir: Path) -> int:
    """Write the grid's records (plain writes: the store's fsync per file is not what is measured)."""
    n = 0
    for i, (model, seq, mbs, ga, dp, zero) in enumerate(
        itertools.product(MODELS, SEQ_LENS, MBSS, GRAD_ACCS, DPS, ZERO_STAGES)
    ):
        status = Status.OK
        if peak_mem_bytes(seq, mbs, dp, zero) > MEMORY_GB * GIB:
            status = Status.PREDICTED_OOM if mbs == MBSS[-1] else Status.OOM
        elif i % 97 == 0:
            status = (Status.TIMEOUT, Status.FAILED, Status.INVALID)[i % 3]
        record = make_record(
            status,
            model=model,
            seq_len=seq,
            mbs=mbs,
            grad_acc=ga,
            dp=dp,
            zero_stage=zero,
            memory_gb=MEMORY_GB,
            sweep="bench",
        )
        path = sweep_dir / record["job_key"] / RESULT_FILE
        path.parent.mkdir()
        path.write_text(json.dumps(record))
        n += 1
    return n


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (the drawing workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Timer:
    """Wall-clock and CPU seconds of a block (CPU time is what a shared, busy machine does not inflate)."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, cpu_seconds() - self.cpu

    def __str__(self) -> str:
        return f"{self.wall:.2f} s wall, {self.cpu:.2f} s CPU"


def main() -> None:
    """Run the benchmark and print its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp)
        with Timer() as t_write:
            n = write_records(sweep)
        with Timer() as t_collect:
            df = collect(sweep)
        with Timer() as t_serial:
            render_pngs(figure_specs(df), sweep / "serial", jobs=1)
        with Timer() as t_heatmaps:
            pngs = render_pngs(figure_specs(df), sweep / "report")
        png_mb = sum(p.stat().st_size for p in pngs.values()) / 1e6

    jobs = min(usable_cores(), len(pngs))
    print(f"records written: {n} in {t_write} (setup, not part of the total)")
    print(f"statuses: { {k: int(v) for k, v in df['status'].value_counts().items()} }")
    print(f"layout: {default_layout(df)}")
    print(f"collect ({len(df)} rows x {df.shape[1]} columns): {t_collect}")
    facets = len(ZERO_STAGES) * len(DPS) * len(pngs)
    print(
        f"heatmaps ({len(pngs)} figures, {facets} facets, {png_mb:.1f} MB of PNG) in 1 process: {t_serial} (reference)"
    )
    print(
        f"heatmaps in {jobs} processes, as the report draws them: {t_heatmaps}; "
        f"{t_serial.wall / t_heatmaps.wall:.2f}x faster than 1 process"
    )
    wall = t_collect.wall + t_heatmaps.wall
    print(f"total collect + heatmaps: {wall:.2f} s wall (target < 10 s)")
    print(f"load average while running: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
