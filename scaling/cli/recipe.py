"""`scaling recipe`: the batch-size recipe end to end, and what to run on each GPU count.

    scaling recipe [overrides] --gbs-tokens 4M --gpus 8,32,128,512 [--tokens 1T] [--sweep-dir DIR] [--json]

(1) the global batch in tokens and (2) seq_len are fixed (train.seq_len, overrides pick the model, hardware and
precision as everywhere); (3) per ZeRO stage and recompute setting, the largest mbs that fits one device of the
target hardware: predicted, and confirmed by two real runs (find-mbs) when the devices at hand are of its kind;
(4) grad_acc = gbs / (mbs × GPUs). It measures each candidate at dp=1 and at the largest dp the devices at hand
allow (with launch.repeats), takes the network from the directory's `scaling collectives` profile (measured now
when two or more devices are at hand and there is none), else the hardware's published figures, and
extrapolates the rest (analysis.recipe). Every measurement is an ordinary record in the sweep directory, so a
second call measures nothing new and a killed call resumes. Writes DIR/recipe.md and DIR/recipe.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from scaling.cli.args import parse_count
from scaling.core.batch import BatchError, target_gbs_samples
from scaling.core.host import usable_cores
from scaling.core.validate import InvalidConfig, validate

STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "full")
DEFAULT_DIR = "runs/recipe"


def _counts(text: str) -> list[int]:
    """'8,32,128' -> [8, 32, 128] (each a positive count; 4k style suffixes allowed)."""
    return [parse_count(part) for part in text.split(",") if part.strip()]


def _choices(text: str, valid: tuple, cast: type) -> list:
    values = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            value = cast(part)
        except ValueError:
            value = None
        if value not in valid:
            raise argparse.ArgumentTypeError(f"{part!r} is not one of {', '.join(map(str, valid))}")
        values.append(value)
    return values


def parser() -> argparse.ArgumentParser:
    """The command line of `scaling recipe`."""
    p = argparse.ArgumentParser(prog="scaling recipe", description=__doc__.split("\n\n")[0])
    p.add_argument("--gbs-tokens", type=parse_count, required=True, help="target global batch in tokens, e.g. 4M")
    p.add_argument("--gpus", type=_counts, required=True, help="GPU counts to answer for, e.g. 8,32,128,512")
    p.add_argument("--tokens", type=parse_count, default=None, help="tokens to train on, e.g. 1T (time, GPU-hours)")
    p.add_argument("--sweep-dir", default=None, help=f"where the records and the recipe go (default {DEFAULT_DIR})")
    p.add_argument("--json", action="store_true", help="print recipe.json instead of the table")
    p.add_argument(
        "--zero", type=lambda t: _choices(t, STAGES, int), default=list(STAGES), help="ZeRO stages (default 0,1,2,3)"
    )
    p.add_argument(
        "--recompute",
        type=lambda t: _choices(t, RECOMPUTE, str),
        default=list(RECOMPUTE),
        help="train.recompute settings (default none,full)",
    )
    p.add_argument("--threshold", type=float, default=0.8, help="efficiency below which DP stops paying off (0.8)")
    p.add_argument(
        "--max-grad-acc",
        type=int,
        default=16,
        help="a measured point runs at most this many micro-steps (a larger grad_acc is extrapolated; default 16)",
    )
    p.add_argument("--draws", type=int, default=200, help="bootstrap draws of each band (default 200)")
    p.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. model=small train.seq_len=256 hardware.memory_gb=0.05"
    )
    return p


def devices_at_hand(cfg: dict[str, Any]) -> int:
    """Devices of the target's kind this host offers: CPU ranks of hardware.threads_per_device cores each, or the
    GPUs CUDA_VISIBLE_DEVICES (else nvidia-smi) lists, at most devices_per_node; 0 when none."""
    hw = cfg["hardware"]
    if hw["device"] == "cpu":
        return max(1, usable_cores() // int(hw["threads_per_device"]))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = len([d for d in visible.split(",") if d.strip()])
    elif shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
        count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    else:
        count = 0
    per_node = hw["devices_per_node"]
    return min(count, per_node) if per_node else count


@dataclass
class Launcher:
    """Runs points through scaling.job.run.run_point and counts which it launched and which the store answered."""

    launched: int = 0
    answered: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, cfg: dict[str, Any]) -> dict[str, Any]:
        from scaling.job.run import run_point
        from scaling.store.record import answers, job_key, read_record

        key = job_key(cfg)
        if answers(read_record(Path(cfg["sweep_dir"]).resolve(), key), key, cfg["launch"]):
            self.answered += 1
        else:
            self.launched += 1
        record = run_point(cfg)
        self.records.append(record)
        return record


def _point(cfg: dict[str, Any], zero: int, recompute: str, mbs: int, dp: int, grad_acc: int) -> dict[str, Any]:
    train = {**cfg["train"], "mbs": mbs, "grad_acc": grad_acc, "gbs": None, "gbs_tokens": None, "recompute": recompute}
    return {**cfg, "train": train, "parallel": {**cfg["parallel"], "zero_stage": zero, "dp": dp}}


def _refuse(message: str) -> int:
    print(f"scaling recipe: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[list[str]] = None) -> int:
    """`scaling recipe`: measure what the sweep directory lacks, then print and write the recipe."""
    p = parser()
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 < a.threshold < 1:
        p.error(f"--threshold={a.threshold} must lie between 0 and 1, e.g. 0.8")
    if a.max_grad_acc < 1:
        p.error(f"--max-grad-acc={a.max_grad_acc} must be >= 1")
    if a.draws < 10:
        p.error(f"--draws={a.draws} must be >= 10")
    sweep_dir = Path(a.sweep_dir or DEFAULT_DIR)
    overrides = [o for o in a.overrides if not o.startswith(("sweep_dir=", "sweep="))]
    cfg = _compose(overrides, sweep_dir)
    if isinstance(cfg, str):
        return _refuse(cfg)
    seq_len = int(cfg["train"]["seq_len"])
    try:
        gbs_samples = target_gbs_samples(seq_len, None, a.gbs_tokens)
    except BatchError as e:
        return _refuse(re.sub(r"(train\.)?gbs_tokens", "--gbs-tokens", str(e)))
    try:  # the smallest point of the recipe: seq_len within the model, heads, precision, the host's cores
        validate(_point(cfg, a.zero[0], a.recompute[0], 1, 1, 1))
    except InvalidConfig as e:
        return _refuse(str(e))
    from scaling.predictor.prescreen import capacity_bytes

    capacity = capacity_bytes(cfg)
    if capacity is None:
        return _refuse(
            "hardware.memory_gb=null: the recipe needs a device capacity to find the largest mbs, e.g. "
            "hardware=h100, or hardware.memory_gb=0.05 for an emulated device on CPU"
        )
    from analysis.recipe import RECIPE_JSON, RECIPE_MD, dumps, markdown, terminal
    from scaling.core.files import write_json_atomic

    recipe = run_recipe(cfg, overrides, sweep_dir, gbs_samples, a)
    write_json_atomic(sweep_dir / RECIPE_JSON, recipe.to_json())
    (sweep_dir / RECIPE_MD).write_text(markdown(recipe))
    print(
        dumps(recipe)
        if a.json
        else terminal(recipe) + f"\n\nwritten: {sweep_dir / RECIPE_MD}, {sweep_dir / RECIPE_JSON}"
    )
    return 0


def _compose(overrides: list[str], sweep_dir: Path) -> dict[str, Any] | str:
    """The resolved base config (warm ranks unless the overrides say otherwise), or why it cannot be composed."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from scaling.sweep.compose import compose_config

    reuse = [] if any(o.startswith("launch.reuse=") for o in overrides) else ["launch.reuse=true"]
    try:
        return compose_config([*reuse, *overrides, "sweep=recipe", f"sweep_dir={sweep_dir}"])
    except (HydraException, OmegaConfBaseException) as e:
        text = str(e).splitlines()[0]
        if "model" in text and ("Could not find" in text or "not found" in text):
            from scaling.core.schema import config_dirs

            names = sorted({f.stem for d in config_dirs() for f in (d / "model").glob("*.yaml")})
            return f"{text}: valid models are {', '.join(names)}"
        return text


def network_sizes(model: Any, cfg: dict[str, Any], candidates: list[Any], gbs_samples: int, n: int) -> list[int]:
    """The message sizes worth timing: `scaling collectives`' defaults up to the first at or above the largest
    message any candidate's step issues at dp=n, and at least the first four (4 KiB to 4 MiB): with fewer, one
    noisy small size can make time fall with size and β unfittable."""
    from analysis.recipe import workload_of
    from analysis.step_model import step_collectives
    from scaling.store.network import CPU_SIZES, CUDA_SIZES

    largest = max(
        call.bytes_per_call
        for c in candidates
        for call in step_collectives(workload_of(model, cfg, c, c.mbs_max, gbs_samples), n, 1)
    )
    defaults = CUDA_SIZES if cfg["hardware"]["device"] == "cuda" else CPU_SIZES
    upto = next((i for i, size in enumerate(defaults) if size >= largest), len(defaults) - 1)
    return list(defaults[: max(upto, 3) + 1])


def run_recipe(cfg: dict[str, Any], overrides: list[str], sweep_dir: Path, gbs_samples: int, a: argparse.Namespace):
    """Phases (a)-(c) of the recipe, then the decision (analysis.recipe.decide)."""
    from analysis.extrapolate import sources
    from analysis.recipe import Candidate, FromRecords, Recipe, split, workload_of
    from analysis.recipe import decide as decide_rows
    from scaling.cli.find_mbs import find_mbs
    from scaling.core.schema import ModelConfig
    from scaling.predictor.analytic import predict_config
    from scaling.predictor.prescreen import capacity_bytes

    seq_len, hw = int(cfg["train"]["seq_len"]), cfg["hardware"]
    model = ModelConfig(**cfg["model"])
    at_hand = devices_at_hand(cfg)
    launch = Launcher()
    notes: list[str] = []
    print(f"[recipe] {at_hand} {hw['device']} device(s) of {hw['name']} at hand; records in {sweep_dir}", flush=True)

    # (a) the largest mbs per ZeRO stage and recompute setting
    candidates: list[Candidate] = []
    for zero in a.zero:
        for recompute in a.recompute:
            base = _point(cfg, zero, recompute, 1, 1, 1)
            found = find_mbs(base, max_mbs=gbs_samples, traced=False, confirm=at_hand >= 1, launch_point=launch)
            how = found.note if at_hand >= 1 else f"predicted ({found.method}): no {hw['name']} device at hand"
            if found.mbs < 1:
                notes.append(f"ZeRO-{zero}, recompute {recompute}: not even mbs=1 fits one device ({how})")
                continue
            candidates.append(Candidate(zero, recompute, found.mbs, how))
            print(f"[recipe] ZeRO-{zero}, recompute {recompute}: largest mbs {found.mbs} ({how})", flush=True)

    # (b) throughput at dp=1 and at the largest dp at hand, for each mbs a requested GPU count needs
    dps = sorted({1, at_hand}) if at_hand >= 1 else []
    counts = sorted({1, *a.gpus})
    for c in candidates:
        for mbs in sorted({s.mbs for n in counts if (s := split(gbs_samples, seq_len, n, c.mbs_max))}):
            for dp in dps:
                s = split(gbs_samples, seq_len, dp, mbs)
                if s is None or s.mbs != mbs:
                    continue
                launch(_point(cfg, c.zero_stage, c.recompute, mbs, dp, min(s.grad_acc, a.max_grad_acc)))
    if not dps:
        notes.append(f"nothing measured: no {hw['name']} device at hand; run the recipe where it is")

    # (c) the network: the directory's profile, measured now when two or more devices are at hand, else published
    dpn = hw["devices_per_node"]
    found_sources, source_notes = sources(sweep_dir, hw["name"], dpn, a.draws)
    has_profile = len(found_sources) > 1 and found_sources[1].kind == "profile"
    if not has_profile and at_hand >= 2 and any(p.get("status") == "ok" for p in launch.records):
        from scaling.cli.collectives import main as collectives

        sizes = network_sizes(model, cfg, candidates, gbs_samples, at_hand)
        print(
            f"[recipe] measuring the network at up to {at_hand} ranks (scaling collectives, messages up to "
            f"{sizes[-1]:,} bytes: the candidates' largest, or more)",
            flush=True,
        )
        collectives(
            ["--sweep-dir", str(sweep_dir), "--sizes", ",".join(map(str, sizes)), *overrides, f"parallel.dp={at_hand}"]
        )
        found_sources, source_notes = sources(sweep_dir, hw["name"], dpn, a.draws)
    source = found_sources[1] if len(found_sources) > 1 else None
    if source is None:
        network = "fitted to the measured DP curve alone (no profile and no published figures)"
    elif source.kind == "profile":
        network = f"{source.label}, measured in this directory by `scaling collectives`"
    else:
        network = f"{source.label} (the hardware's published figures)"
    notes += [n for n in source_notes if "No measured profile" not in n or source is None]

    estimate = FromRecords(
        launch.records, lambda c, mbs: workload_of(model, cfg, c, mbs, gbs_samples), dpn, source, a.draws
    )

    def predicted_peak(c: Candidate, s: Any) -> int:
        return predict_config(_point(cfg, c.zero_stage, c.recompute, s.mbs, s.gpus, s.grad_acc), s.grad_acc).total_bytes

    def command(c: Candidate, s: Any) -> str:
        settings = [
            f"train.mbs={s.mbs}",
            f"train.grad_acc={s.grad_acc}",
            f"parallel.dp={s.gpus}",
            f"parallel.zero_stage={c.zero_stage}",
            f"train.recompute={c.recompute}",
            f"sweep_dir={sweep_dir}",
        ]
        keys = {o.split("=", 1)[0] for o in settings}
        kept = [o for o in overrides if o.split("=", 1)[0] not in keys and not o.startswith("launch.reuse=")]
        return "scaling run " + " ".join(shlex.quote(o) for o in [*kept, *settings])

    rows, first, band, baseline = decide_rows(
        candidates,
        gbs_samples,
        seq_len,
        a.gpus,
        estimate,
        a.threshold,
        a.tokens,
        capacity_bytes(cfg),
        predicted_peak,
        command,
    )
    print(f"[recipe] {launch.launched} point(s) launched, {launch.answered} answered from the store", flush=True)
    return Recipe(
        model=str(cfg["model"]["name"]),
        seq_len=seq_len,
        gbs_tokens=a.gbs_tokens,
        gbs_samples=gbs_samples,
        hardware=str(hw["name"]),
        threshold=a.threshold,
        tokens=a.tokens,
        candidates=candidates,
        network=network,
        rows=rows,
        dp_stops_paying_off_at=first,
        dp_stops_paying_off_range=band,
        max_useful_gpus=gbs_samples,
        baseline_tokens_per_s_per_gpu=baseline,
        notes=notes,
    )


if __name__ == "__main__":
    sys.exit(main())
