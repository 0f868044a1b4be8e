"""How long the analysis takes on a large sweep: 10,000 records -> DataFrame -> every heatmap.

Writes 10,000 synthetic records (4 models x 5 seq_len x 5 mbs x 5 grad_acc x 5 dp x 4 ZeRO
stages, every status present) to a temporary sweep directory, then times `collect`, building the
standard heatmaps (3 metrics x 20 facets) and rendering them to PNG. Prints the figures; the
target is under 10 s for collect + heatmaps on one core.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from analysis.collect import collect  # noqa: E402
from analysis.heatmaps import default_layout, draw_all  # noqa: E402
from records import GIB, make_record, peak_mem_bytes  # noqa: E402
from scaling.record import FAILED, INVALID, OK, OOM, PREDICTED_OOM, RESULT_FILE, TIMEOUT  # noqa: E402

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
    for i, (model, seq, mbs, ga, dp, zero) in enumerate(itertools.product(MODELS, SEQ_LENS, MBSS, GRAD_ACCS, DPS,
                                                                          ZERO_STAGES)):
        status = OK
        if peak_mem_bytes(seq, mbs, dp, zero) > MEMORY_GB * GIB:
            status = PREDICTED_OOM if mbs == MBSS[-1] else OOM
        elif i % 97 == 0:
            status = (TIMEOUT, FAILED, INVALID)[i % 3]
        record = make_record(status, model=model, seq_len=seq, mbs=mbs, grad_acc=ga, dp=dp, zero_stage=zero,
                             memory_gb=MEMORY_GB, sweep="bench")
        path = sweep_dir / record["job_key"] / RESULT_FILE
        path.parent.mkdir()
        path.write_text(json.dumps(record))
        n += 1
    return n


class Timer:
    """Wall-clock and CPU seconds of a block (CPU time is what a shared, busy machine does not inflate)."""

    def __enter__(self) -> "Timer":
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

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
        with Timer() as t_draw:
            figures = draw_all(df)
        with Timer() as t_render:
            sizes = []
            for fig in figures.values():
                png = io.BytesIO()
                fig.savefig(png, format="png", dpi=100)
                sizes.append(len(png.getvalue()))

    facets = sum(len([ax for ax in fig.axes if ax.get_title()]) for fig in figures.values())
    print(f"records written: {n} in {t_write} (setup, not part of the total)")
    print(f"statuses: { {k: int(v) for k, v in df['status'].value_counts().items()} }")
    print(f"layout: {default_layout(df)}")
    print(f"collect ({len(df)} rows x {df.shape[1]} columns): {t_collect}")
    print(f"build heatmaps ({len(figures)} figures, {facets} facets): {t_draw}")
    print(f"render heatmaps to PNG ({sum(sizes) / 1e6:.1f} MB): {t_render}")
    wall = t_collect.wall + t_draw.wall + t_render.wall
    cpu = t_collect.cpu + t_draw.cpu + t_render.cpu
    print(f"total collect + heatmaps: {wall:.2f} s wall, {cpu:.2f} s CPU (target < 10 s)")
    print(f"load average while running: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
