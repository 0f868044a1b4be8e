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
from scaling.core.model_group import TP_DEGREES
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
from scaling.recipe.answer import Recipe
from scaling.recipe.decide import decide as decide_rows
from scaling.recipe.decide import knee_of_full_sharding
from scaling.recipe.estimate import FromRecords, workload_of
from scaling.recipe.mbs_search import find_mbs, largest_mbs_by_gpus
from scaling.recipe.next_point import suggest
from scaling.recipe.options import Candidate, Estimate, Split, split
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
    cfg: ExperimentConfig,
    zero: int,
    recompute: str,
    mbs: int,
    dp: int,
    grad_acc: int,
    dp_shard: Optional[int] = None,
    tp: int = 1,
) -> ExperimentConfig:
    """The base config at one point of the recipe: ZeRO stage, recompute, mbs, dp, grad_acc, dp_shard and tp set, no
    batch target."""
    train = {"mbs": mbs, "grad_acc": grad_acc, "gbs": None, "gbs_tokens": None, "recompute": recompute}
    return cfg.changed(train=train, parallel={"zero_stage": zero, "dp": dp, "dp_shard": dp_shard, "tp": tp})


def candidate_point(cfg: ExperimentConfig, c: Candidate, mbs: int, dp: int, grad_acc: int) -> ExperimentConfig:
    """A candidate's point at dp data-parallel ranks (its dp_shard where it divides dp, its tp)."""
    return point_config(cfg, c.zero_stage, c.recompute, mbs, dp, grad_acc, c.shard_at(dp), c.tp)


HYBRID_POLICIES = 3
"""Hybrid sharding candidates per ZeRO-2/3 setting: shard groups of one node, two and four (where fewer GPUs than
asked for)."""


def layouts(cfg: ExperimentConfig, zero: int, gpus: list[int]) -> list[tuple[Optional[int], int]]:
    """(parallel.dp_shard, parallel.tp) layouts to weigh for a ZeRO stage: full sharding; for ZeRO-2/3 on nodes,
    shard groups of 1, 2, 4 nodes (hybrid), and tp 2, 4, 8 within a node where the model's plan allows them."""
    dpn = cfg.hardware.devices_per_node
    if zero < 2 or not dpn:
        return [(None, 1)]
    top = max(gpus)
    hybrid = [(dpn * 2**j, 1) for j in range(HYBRID_POLICIES) if dpn * 2**j < top]
    return [(None, 1), *hybrid, *((None, t) for t in tp_degrees(cfg, top))]


def tp_degrees(cfg: ExperimentConfig, most: int) -> list[int]:
    """The tensor-parallel degrees a model runs (scaling.core.validate's check) within a node and the GPUs asked."""
    from scaling.core.validate import InvalidConfig, validate
    from scaling.model.family import checked

    out = []
    for t in TP_DEGREES[1:]:  # above 1, where they split every head and width and fit a node
        if t > most:
            break
        try:
            validate(cfg.changed(parallel={"tp": t, "zero_stage": 3, "dp_shard": None}), host=False)
            checked(cfg.model, cfg.train.seq_len, t)  # a plan, and heads and widths it splits
        except InvalidConfig:
            continue
        out.append(t)
    return out


@dataclass(frozen=True)
class ModelFigures:
    """What the recipe plans with: the model's parameters and model FLOPs per token (the built-in family's closed
    form; a model the user brings counted on fake tensors), and the shape its step model is made of."""

    n_params: int
    flops_per_token: float
    shape: ModelShape
    """Its parameter tensors and blocks, as its family gives them."""

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> ModelFigures:
        """Counted once per model and seq_len (a model the user brings: cached); ModelError when a model
        the user brings breaks the contract."""
        family = family_of(cfg.model)
        counted = family.counted(cfg.train.seq_len)
        return cls(counted.n_params, counted.flops_per_token, family.shape(cfg.train.seq_len))


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

    # (a) per ZeRO stage and recompute setting, the largest mbs that fits per rank at each count it may run at
    candidates = _candidates(cfg, a, gbs_samples, at_hand, launch, sweep_dir, notes)

    # (b) throughput from the fewest GPUs each candidate fits on (one node first) to all at hand, for each mbs a
    # requested GPU count needs
    counts = sorted({1, *a.gpus})
    for c in candidates:
        at = sorted({c.fit_gpus, at_hand}) if c.fit_gpus is not None and at_hand >= c.fit_gpus else []
        for mbs in sorted({s.mbs for n in counts if (s := c.split_at(gbs_samples, seq_len, n))}):
            for dp in (c.dp_at(g) for g in at if c.mbs_for(g) >= mbs and c.dp_at(g)):
                s = split(gbs_samples, seq_len, dp, mbs)
                if s is None or s.mbs != mbs:
                    continue
                launch(candidate_point(cfg, c, mbs, dp, min(s.grad_acc, a.max_grad_acc)))
    if at_hand < 1:
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
        point = candidate_point(cfg, c, s.mbs, s.gpus, s.grad_acc)
        if not family_of(cfg.model).closed_form:  # traced on fake tensors in a fake world of s.gpus ranks
            from scaling.predictor.trace import trace_peak_kept

            return trace_peak_kept(point, sweep_dir).peak_mem_bytes
        return predict_config(point, s.grad_acc).total_bytes

    def command(c: Candidate, s: Any) -> str:
        settings = [
            f"train.mbs={s.mbs}",
            f"train.grad_acc={s.grad_acc}",
            f"parallel.dp={s.gpus}",
            *([f"parallel.tp={c.tp}"] if c.tp > 1 else []),
            f"parallel.zero_stage={c.zero_stage}",
            f"train.recompute={c.recompute}",
            *([f"parallel.dp_shard={c.shard_at(s.gpus)}"] if c.shard_at(s.gpus) else []),
            f"sweep_dir={sweep_dir}",
        ]
        keys = {o.split("=", 1)[0] for o in settings}
        kept = [o for o in overrides if o.split("=", 1)[0] not in keys and not o.startswith("launch.reuse=")]
        return "scaling run " + " ".join(shlex.quote(o) for o in [*kept, *settings])

    rows, first, band, baseline, baseline_gpus = decide_rows(
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
    first_full = knee_of_full_sharding(candidates, gbs_samples, seq_len, estimate, baseline, baseline_gpus, a.threshold)
    next_point = suggest(
        candidates,
        rows,
        launch.records,
        lambda records: FromRecords(records, workload, dpn, source, a.draws, planned),
        gbs_samples,
        seq_len,
        dpn,
        cfg.train.warmup_steps + cfg.train.steps,
        hw.device,
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
        max_useful_gpus=gbs_samples * max((c.tp for c in candidates), default=1),
        baseline_tokens_per_s_per_gpu=baseline,
        notes=notes,
        baseline_gpus=baseline_gpus,
        next_measurement=next_point.to_json() if next_point is not None else None,
        dp_stops_paying_off_full=first_full,
    )


def _candidates(
    cfg: ExperimentConfig,
    a: RecipeRequest,
    gbs_samples: int,
    at_hand: int,
    launch: Launcher,
    sweep_dir: Path,
    notes: list[str],
) -> list[Candidate]:
    """Per ZeRO stage and recompute setting, the largest mbs that fits per rank at each GPU count it may run at
    (predicted; confirmed by two runs at the fewest GPUs it fits on where those are at hand); a setting that fits at
    no count is left out and said, and when none fits the notes say from how many GPUs each would."""
    hw = cfg.hardware
    most = gbs_samples * max(tp_degrees(cfg, max(a.gpus)) or [1]) if hw.devices_per_node else gbs_samples
    judged = sorted({*(2**k for k in range(most.bit_length())), *a.gpus, at_hand} & set(range(1, most + 1)))
    closed_form = family_of(cfg.model).closed_form
    if not closed_form:  # each count is a trace: only the counts asked for and those at hand
        judged = sorted({1, *a.gpus, at_hand} & set(range(1, most + 1)))
    found: list[Candidate] = []
    for zero, recompute, (dp_shard, tp) in (
        (z, r, k) for z in a.zero for r in a.recompute for k in layouts(cfg, z, a.gpus)
    ):
        base = point_config(cfg, zero, recompute, 1, 1, 1)
        mbs_at = largest_mbs_by_gpus(base, judged, gbs_samples, sweep_dir, dp_shard, tp)
        fit = next((n for n in judged if mbs_at[n] >= 1), None)
        name = Candidate(zero, recompute, 0, "", dp_shard=dp_shard, tp=tp).name
        if fit is None:
            notes.append(f"{name}: not even mbs=1 fits per rank at any GPU count up to {judged[-1]}")
            continue
        how = f"predicted (analytic{'' if closed_form else ', traced'}): no {hw.name} device at hand"
        if at_hand >= fit:  # confirmed on the devices at hand, at the fewest GPUs it fits on
            confirmed = find_mbs(
                base.changed(parallel={"dp": fit}),
                max_mbs=gbs_samples // fit,
                traced=False,
                launch_point=launch,
                traces_in=sweep_dir,
            )
            mbs_at = _scaled(mbs_at, fit, confirmed.mbs)
            how = confirmed.note + ("" if fit == 1 else f" at dp={fit}")
        if mbs_at[fit] < 1:
            notes.append(f"{name}: not even mbs=1 fits at {fit} GPU(s) ({how})")
            continue
        found.append(Candidate(zero, recompute, mbs_at[fit], how, tuple(sorted(mbs_at.items())), dp_shard, tp))
        where = "one device" if fit == 1 else f"{fit} GPUs (sharded)"
        print(f"[recipe] {name}: largest mbs {mbs_at[fit]} on {where} ({how})", flush=True)
    if not found:
        notes.append(fits_from(cfg, a))
    return found


def _scaled(mbs_at: dict[int, int], at: int, confirmed: int) -> dict[int, int]:
    """The predicted mbs per count with the count `at` set to what runs confirmed, and the larger counts lowered in
    proportion when the runs found less room than predicted."""
    predicted = mbs_at[at]
    factor = confirmed / predicted if predicted and confirmed < predicted else 1.0
    return {n: confirmed if n == at else (int(m * factor) if n > at else m) for n, m in mbs_at.items()}


def fits_from(cfg: ExperimentConfig, a: RecipeRequest, most: int = 2**20) -> str:
    """Where a model that fits at no requested count would start to fit: per ZeRO stage and recompute setting, the
    fewest GPUs (powers of two) at which mbs=1 fits per rank, whatever the batch."""
    starts = []
    for zero in a.zero:
        for recompute in a.recompute:
            base = point_config(cfg, zero, recompute, 1, 1, 1)
            counts = [2**k for k in range(most.bit_length()) if zero > 0 or k == 0]
            mbs_at = largest_mbs_by_gpus(base, counts, most)
            n = next((n for n in counts if mbs_at[n] >= 1), None)
            starts.append(f"ZeRO-{zero} recompute {recompute} " + (f"from {n} GPUs" if n else "at no count"))
    return f"{cfg.model.name} fits on no GPU count the batch can use; it would start to fit: {'; '.join(starts)}"
