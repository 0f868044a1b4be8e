"""The batch-size recipe end to end: measure what the sweep directory lacks, then decide (scaling.recipe.decide).

(1) the global batch in tokens and (2) seq_len are fixed (the nearest whole number of sequences when the batch is
not one); (3) per ZeRO stage and recompute setting, the largest mbs that fits one device of the target hardware:
predicted, and confirmed by two real runs (find_mbs) when the devices at hand are of its kind; (4) grad_acc = gbs /
(mbs × GPUs). Each candidate is measured at dp=1 and at the largest dp the devices at hand allow (with
launch.repeats); the network comes from the directory's `scaling collectives` profile (measured now when two or
more devices are at hand and there is none), else the hardware's published figures. Every measurement is an
ordinary record in the sweep directory, so a second call measures nothing new and a killed call resumes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from scaling.core.batch import nearest_whole_batch
from scaling.core.host import usable_cores
from scaling.core.schema import ExperimentConfig, HardwareConfig
from scaling.engine.peak_flops import configured_peak_flops_per_s
from scaling.job.run import run_point
from scaling.launch.network_probe import measure_and_save
from scaling.model.family import family_of
from scaling.model.shape import ModelShape
from scaling.perf.mfu_model import Work
from scaling.perf.network import CPU_SIZES, CUDA_SIZES, NetworkEstimate
from scaling.perf.network_figures import sources
from scaling.perf.step_model import step_collectives
from scaling.predictor.analytic import predict_config
from scaling.predictor.prescreen import capacity_bytes
from scaling.recipe.decide import Candidate, Estimate, Recipe, Split, split
from scaling.recipe.decide import decide as decide_rows
from scaling.recipe.estimate import FromRecords, workload_of
from scaling.recipe.mbs_search import find_mbs
from scaling.recipe.predicted import Predicted, flops_split, mfu_model
from scaling.recipe.request import RecipeRequest
from scaling.store.read import RecordError, read_record
from scaling.store.record import answers, job_key


def devices_at_hand(hw: HardwareConfig) -> int:
    """Devices of the target's kind this host offers: CPU ranks of hardware.threads_per_device cores each, or the
    GPUs CUDA_VISIBLE_DEVICES (else nvidia-smi) lists, at most devices_per_node; 0 when none."""
    if hw.device == "cpu":
        return max(1, usable_cores() // hw.threads_per_device)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = len([d for d in visible.split(",") if d.strip()])
    elif shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
        count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    else:
        count = 0
    per_node = hw.devices_per_node
    return min(count, per_node) if per_node else count


@dataclass
class Launcher:
    """Runs points through scaling.job.run.run_point and counts which it launched and which the store answered."""

    launched: int = 0
    answered: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, cfg: ExperimentConfig) -> dict[str, Any]:
        key = job_key(cfg)
        try:
            stored = read_record(Path(cfg.sweep_dir).resolve(), key)
        except RecordError:
            stored = None  # run_point sets a corrupt one aside, or leaves an unreadable one and does not run it
        if answers(stored, key, cfg.launch):
            self.answered += 1
        else:
            self.launched += 1
        record = run_point(cfg)
        self.records.append(record)
        return record


def point_config(
    cfg: ExperimentConfig, zero: int, recompute: str, mbs: int, dp: int, grad_acc: int
) -> ExperimentConfig:
    """The base config at one point of the recipe: ZeRO stage, recompute, mbs, dp and grad_acc set, no batch target."""
    train = {"mbs": mbs, "grad_acc": grad_acc, "gbs": None, "gbs_tokens": None, "recompute": recompute}
    return cfg.changed(train=train, parallel={"zero_stage": zero, "dp": dp})


@dataclass(frozen=True)
class ModelFigures:
    """What the recipe plans with: the model's parameters and model FLOPs per token (the built-in family's closed
    form; a model the user brings counted on fake tensors), and the shape its step model is made of."""

    n_params: int
    flops_per_token: float
    shape: Optional[ModelShape]
    """None for the built-in family (the step model derives it from config.model)."""

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> ModelFigures:
        """Counted once per model and seq_len (a model the user brings: cached); ModelError when a model
        the user brings breaks the contract."""
        counted = family_of(cfg.model).counted(cfg.train.seq_len)
        if not cfg.custom:
            return cls(counted.n_params, counted.flops_per_token, None)
        shape = ModelShape.of(cfg.model.name, counted.tensors, counted.n_blocks)
        return cls(counted.n_params, counted.flops_per_token, shape)


def network_sizes(
    cfg: ExperimentConfig, candidates: list[Any], gbs_samples: int, n: int, shape: Optional[ModelShape] = None
) -> list[int]:
    """The message sizes worth timing: `scaling collectives`' defaults up to the first at or above the largest
    message any candidate's step issues at dp=n, and at least the first four (4 KiB to 4 MiB): with fewer, one
    noisy small size can make time fall with size and β unfittable."""
    largest = max(
        call.bytes_per_call
        for c in candidates
        for call in step_collectives(workload_of(cfg, c, c.mbs_max, gbs_samples, shape), n, 1)
    )
    defaults = CUDA_SIZES if cfg.hardware.device == "cuda" else CPU_SIZES
    upto = next((i for i, size in enumerate(defaults) if size >= largest), len(defaults) - 1)
    return list(defaults[: max(upto, 3) + 1])


def plan(
    cfg: ExperimentConfig,
    workload: Any,
    source: Optional[NetworkEstimate],
    a: RecipeRequest,
    figures: ModelFigures,
    records: Sequence[dict[str, Any]] = (),
) -> tuple[Optional[Callable[[Candidate, Split], Optional[Estimate]]], Optional[str]]:
    """The predicted figures for candidates with nothing measured (scaling.recipe.predicted: the hardware's MFU model,
    fitted to conf/mfu/ and to `records` on that hardware), and a note when there are none: no network figures, no
    peak FLOP/s, or no MFU model of the hardware and none assumed."""
    hw, t = cfg.hardware, cfg.train
    peak = configured_peak_flops_per_s(hw, str(t.precision))
    if source is None or peak is None:
        return None, None
    model = mfu_model(hw.name, str(t.precision), peak, records)
    if model is None and a.assume_mfu is None:
        return None, (
            f"no MFU measured on {hw.name} in {t.precision} (conf/mfu/{hw.name}.yaml, or records at dp=1 here): pass "
            "--assume-mfu to plan the GPU counts nothing was measured for"
        )
    split = flops_split(cfg)
    seq = t.seq_len

    def work(c: Candidate, mbs: int) -> Work:
        return Work(split, mbs * seq, c.zero_stage, c.recompute == "full", bool(t.compile), seq)

    optimizer = model.optimizer_s_per_param if model is not None else 0.0
    return Predicted(workload, work, peak, source, model, a.assume_mfu, optimizer, a.draws), None


def run_recipe(cfg: ExperimentConfig, overrides: list[str], sweep_dir: Path, a: RecipeRequest) -> Recipe:
    """Phases (a)-(c) of the recipe, then the decision (scaling.recipe.decide.decide)."""

    seq_len, hw, model = cfg.train.seq_len, cfg.hardware, cfg.model
    figures = ModelFigures.of(cfg)
    at_hand = devices_at_hand(hw)
    launch = Launcher()
    notes: list[str] = []
    gbs_samples = nearest_whole_batch(a.gbs_tokens, seq_len)
    if gbs_samples * seq_len != a.gbs_tokens:
        notes.append(
            f"--gbs-tokens {a.gbs_tokens:,} is not a whole number of {seq_len}-token sequences: the recipe runs "
            f"the nearest, {gbs_samples:,} sequences = {gbs_samples * seq_len:,} tokens"
        )
    print(f"[recipe] {at_hand} {hw.device} device(s) of {hw.name} at hand; records in {sweep_dir}", flush=True)

    # (a) the largest mbs per ZeRO stage and recompute setting
    candidates: list[Candidate] = []
    for zero in a.zero:
        for recompute in a.recompute:
            base = point_config(cfg, zero, recompute, 1, 1, 1)
            found = find_mbs(
                base, max_mbs=gbs_samples, traced=False, confirm=at_hand >= 1, launch_point=launch, traces_in=sweep_dir
            )
            how = found.note if at_hand >= 1 else f"predicted ({found.method}): no {hw.name} device at hand"
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
                launch(point_config(cfg, c.zero_stage, c.recompute, mbs, dp, min(s.grad_acc, a.max_grad_acc)))
    if not dps:
        notes.append(f"nothing measured: no {hw.name} device at hand; run the recipe where it is")

    # (c) the network: the directory's profile, measured now when two or more devices are at hand, else published
    dpn = hw.devices_per_node
    found_sources, source_notes = sources(sweep_dir, hw.name, dpn, a.draws)
    has_profile = len(found_sources) > 1 and found_sources[1].kind == "profile"
    if not has_profile and at_hand >= 2 and any(p.get("status") == "ok" for p in launch.records):
        sizes = network_sizes(cfg, candidates, gbs_samples, at_hand, figures.shape)
        print(
            f"[recipe] measuring the network at up to {at_hand} ranks (scaling collectives, messages up to "
            f"{sizes[-1]:,} bytes: the candidates' largest, or more)",
            flush=True,
        )
        measure_and_save(cfg.changed(parallel={"dp": at_hand}), sweep_dir, sizes)
        found_sources, source_notes = sources(sweep_dir, hw.name, dpn, a.draws)
    source = found_sources[1] if len(found_sources) > 1 else None
    if source is None:
        network = "fitted to the measured DP curve alone (no profile and no published figures)"
    elif source.kind == "profile":
        network = f"{source.label}, measured in this directory by `scaling collectives`"
    else:
        network = f"{source.label} (the hardware's published figures)"
    notes += [n for n in source_notes if "No measured profile" not in n or source is None]

    workload = lambda c, mbs: workload_of(cfg, c, mbs, gbs_samples, figures.shape)  # noqa: E731
    planned, plan_note = plan(cfg, workload, source, a, figures, launch.records)
    if plan_note:
        notes.append(plan_note)
    estimate = FromRecords(launch.records, workload, dpn, source, a.draws, planned)

    def predicted_peak(c: Candidate, s: Any) -> int:
        point = point_config(cfg, c.zero_stage, c.recompute, s.mbs, s.gpus, s.grad_acc)
        if cfg.custom:  # no closed form: traced on fake tensors in a fake world of s.gpus ranks
            from scaling.predictor.trace import trace_peak_kept

            return trace_peak_kept(point, sweep_dir).peak_mem_bytes
        return predict_config(point, s.grad_acc).total_bytes

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
        capacity_bytes(hw),
        predicted_peak,
        command,
    )
    print(f"[recipe] {launch.launched} point(s) launched, {launch.answered} answered from the store", flush=True)
    return Recipe(
        model=model.name,
        seq_len=seq_len,
        gbs_tokens=gbs_samples * seq_len,
        gbs_samples=gbs_samples,
        hardware=hw.name,
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
