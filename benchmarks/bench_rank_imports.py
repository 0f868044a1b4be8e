"""What a CPU rank imports before its first step, with torch's memory trackers loaded two ways, side by side.

A CPU point runs one step under torch's memory tracker (MemTracker; FSDPMemTracker at ZeRO 2-3). Importing them
the ordinary way runs `torch.distributed._tools/__init__.py`, which imports every tool of the package (the runtime
and activation-checkpointing estimators: the compiler stack, torch's testing code); `scaling.engine.memtrack`
loads the two trackers' modules only. Each sample is a fresh interpreter that imports what a rank of the stage
imports (torch; DDP, whose constructor imports torch._dynamo, at ZeRO 0-1; FSDP2 at ZeRO 2-3) and the trackers,
alternating the two ways, and reports its CPU seconds (user + system). Timing figures: run it on a quiet machine.

    python benchmarks/bench_rank_imports.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from scaling.core.noise import relative_spread  # noqa: E402

RANK = """
import json, resource, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
way, stage = sys.argv[1], int(sys.argv[2])
import torch, torch.distributed
if stage >= 2:
    import torch.distributed.fsdp
else:
    import torch._dynamo  # DistributedDataParallel's constructor imports it
before = cpu()
if way == "package":
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
else:
    from scaling.engine.memtrack import load_trackers
    load_trackers()
print(json.dumps({"total": cpu(), "trackers": cpu() - before}))
"""


def sample(way: str, stage: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", RANK, way, str(stage)], capture_output=True, text=True, check=True, cwd=HERE.parent
    )
    return json.loads(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    a = p.parse_args()
    sample("package", 0)  # the first interpreter reads the files from disk; the rest find them in the page cache
    print(
        f"{a.runs} fresh interpreters per row, alternating; CPU seconds (user + system), median ± relative half-range"
    )
    print("| ZeRO | trackers imported | the rank's imports | of which the trackers |")
    print("|---|---|---|---|")
    for stage in (0, 3):
        runs: dict[str, list[dict[str, float]]] = {"package": [], "trackers only": []}
        for _ in range(a.runs):
            for way in runs:
                runs[way].append(sample("package" if way == "package" else "trackers", stage))
        medians = {}
        for way, samples in runs.items():
            total = [s["total"] for s in samples]
            tracked = [s["trackers"] for s in samples]
            medians[way] = statistics.median(total)
            print(
                f"| {stage} | {way} | {medians[way]:.2f} s ± {relative_spread(total):.0%} "
                f"| {statistics.median(tracked):.2f} s |"
            )
        saved = medians["package"] - medians["trackers only"]
        print(f"| {stage} | saved per rank | {saved:.2f} s ({medians['trackers only'] / medians['package']:.2f}x) | |")


if __name__ == "__main__":
    main()
