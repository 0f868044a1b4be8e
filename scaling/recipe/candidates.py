"""The recipe's candidates: which parallel layouts (scaling.core.layout) and recompute settings to weigh, and the
largest mbs that fits per rank of each at every GPU count it may run at (predicted; confirmed by two runs where
devices of the target's kind are at hand). Where no candidate fits, from how many GPUs each would (`fits_from`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from scaling.core.enums import ZeroStage
from scaling.core.layout import Layout
from scaling.core.model_group import TP_DEGREES
from scaling.core.schema import ExperimentConfig
from scaling.core.validate import InvalidConfig, validate
from scaling.model.family import checked, family_of
from scaling.predictor import TraceError
from scaling.predictor.calibrated import predictor_name
from scaling.predictor.margin import planning_margin
from scaling.predictor.stage_memory import NO_STAGES
from scaling.recipe.mbs_search import find_mbs, largest_mbs_by_gpus
from scaling.recipe.options import Candidate, max_useful_gpus

PP_DEGREES = (2, 4, 8, 16)
"""Pipeline stages the recipe weighs (those that divide the model's blocks)."""
PP_NOT_NEEDED = (
    "pipeline parallelism not weighed: some configuration with ZeRO and tp within a node fits per rank at every "
    "count asked for, and the batch's {gbs} samples give every count a data-parallel rank (pp is weighed past either)"
)
HYBRID_POLICIES = 3
"""Hybrid sharding candidates per ZeRO-2/3 setting: shard groups of one node, two and four (where fewer GPUs than
asked for)."""


def point_config(
    cfg: ExperimentConfig, layout: Layout, recompute: str, mbs: int, grad_acc: int = 1
) -> ExperimentConfig:
    """The base config at one point of the recipe: its layout, recompute, mbs and grad_acc set, no batch target."""
    train = {"mbs": mbs, "grad_acc": grad_acc, "gbs": None, "gbs_tokens": None, "recompute": recompute}
    return cfg.changed(train=train, parallel=layout.parallel())


def candidate_point(cfg: ExperimentConfig, c: Candidate, mbs: int, dp: int, grad_acc: int) -> ExperimentConfig:
    """A candidate's point at dp data-parallel ranks (its shard group where it divides dp, its tp)."""
    return point_config(cfg, c.layout.with_dp(dp), c.recompute, mbs, grad_acc)


def layouts(cfg: ExperimentConfig, zero: int, gpus: list[int]) -> list[Layout]:
    """The layouts to weigh for a ZeRO stage, each at the fewest GPUs it names: full sharding; for ZeRO-2/3 on nodes,
    shard groups of 1, 2, 4 nodes (hybrid), and tp 2, 4, 8 within a node where the model's plan allows them."""
    dpn = cfg.hardware.devices_per_node
    full = Layout(zero)
    if not full.fsdp or not dpn:
        return [full]
    top = max(gpus)
    hybrid = [Layout(zero, 2 * dpn * 2**j, dpn * 2**j) for j in range(HYBRID_POLICIES) if dpn * 2**j < top]
    return [full, *hybrid, *(Layout(zero, tp=t) for t in tp_degrees(cfg, top))]


def tp_degrees(cfg: ExperimentConfig, most: int) -> list[int]:
    """The tensor-parallel degrees a model runs (scaling.core.validate's check) within a node and the GPUs asked."""
    out = []
    for t in TP_DEGREES[1:]:  # above 1, where they split every head and width and fit a node
        if t > most:
            break
        try:
            validate(cfg.changed(parallel=Layout(3, tp=t).parallel()), host=False)
            checked(cfg.model, cfg.train.seq_len, t)  # a plan, and heads and widths it splits
        except InvalidConfig:
            continue
        out.append(t)
    return out


def pp_degrees(cfg: ExperimentConfig) -> list[int]:
    """The pipeline stages the recipe weighs for a model: PP_DEGREES that divide its blocks."""
    blocks = family_of(cfg.model).shape(cfg.train.seq_len).n_blocks
    return [p for p in PP_DEGREES if blocks % p == 0]


def pp_needed(found: list[Candidate], gpus: list[int], gbs_samples: int) -> Optional[str]:
    """Why the recipe weighs pipeline parallelism: a requested count at which no candidate without it fits per rank,
    or one past the GPUs the batch's samples cover (one per dp rank, tp within a node); None: neither."""
    short = [n for n in gpus if not any(c.mbs_for(n) >= 1 for c in found)]
    if short:
        return f"no configuration with ZeRO and tp within a node fits per rank at {', '.join(map(str, short))} GPUs"
    top = max_useful_gpus(gbs_samples, found)
    past = [n for n in gpus if n > top]
    if past:
        return (
            f"the batch's {gbs_samples} samples cover at most {top} GPUs (mbs 1, grad_acc 1, tp within a node): "
            f"{', '.join(map(str, past))} GPUs need more model-parallel ranks"
        )
    return None


def pipeline_decision(
    cfg: ExperimentConfig, found: list[Candidate], gpus: list[int], gbs_samples: int, asked: Sequence[int] = ()
) -> tuple[list[int], str]:
    """The pipeline degrees the recipe weighs beside `found` (the candidates without pipeline stages), and why in one
    sentence: those of `asked` that divide the model's blocks, else PP_DEGREES that do where `pp_needed` says so,
    else none and the reason (none for a model of another family: its stages have no predicted memory)."""
    why = pp_needed([c for c in found if c.layout.pp == 1], gpus, gbs_samples)
    if not family_of(cfg.model).closed_form and (asked or why):
        asked_for = f"pp {', '.join(map(str, asked))} asked for" if asked else why
        return [], f"pipeline parallelism not weighed ({asked_for}): {NO_STAGES}"
    blocks = pp_degrees(cfg)
    if asked:
        degrees = [p for p in asked if p in blocks]
        dropped = sorted(set(asked) - set(degrees))
        return degrees, (
            f"pipeline parallelism weighed as asked (pp {', '.join(map(str, degrees)) or 'none'}, 1F1B)"
            + (
                f"; pp {', '.join(map(str, dropped))} left out: it does not divide the model's blocks"
                if dropped
                else ""
            )
        )
    if why is None:
        return [], PP_NOT_NEEDED.format(gbs=gbs_samples)
    if not blocks:
        return [], f"pipeline parallelism not weighed ({why}): no pp in {PP_DEGREES} divides the model's blocks"
    return blocks, f"pipeline parallelism weighed (pp {', '.join(map(str, blocks))}, 1F1B): {why}"


def find_candidates(
    cfg: ExperimentConfig,
    zero: list[int],
    recompute: list[str],
    gpus: list[int],
    gbs_samples: int,
    at_hand: int,
    launch: Callable[[ExperimentConfig], dict[str, Any]],
    sweep_dir: Path,
    notes: list[str],
    pp: Sequence[int] = (),
) -> list[Candidate]:
    """Per layout and recompute setting, the largest mbs that fits per rank at each GPU count it may run at
    (predicted; confirmed by two runs at the fewest GPUs it fits on where those are at hand); a setting that fits at
    no count is left out and said, and when none fits the notes say from how many GPUs each would. Pipeline stages
    (`pipeline_decision`: where nothing else fits or the batch runs out of samples for dp, or the degrees `pp`
    asked for) at the widest tp within a node, predicted per stage."""
    hw = cfg.hardware
    widest = Layout(tp=max(tp_degrees(cfg, max(gpus)) or [1]))
    most = widest.with_dp(gbs_samples).world_size if hw.devices_per_node else gbs_samples
    judged = sorted({*(2**k for k in range(most.bit_length())), *gpus, at_hand} & set(range(1, most + 1)))
    closed_form = family_of(cfg.model).closed_form
    if not closed_form:  # each count is a trace: only the counts asked for and those at hand
        judged = sorted({1, *gpus, at_hand} & set(range(1, most + 1)))
    found: list[Candidate] = []

    def weigh(layout: Layout, r: str, judged: list[int]) -> None:
        try:
            weigh_one(layout, r, judged)
        except TraceError as e:  # a model one brings whose step fails on fake tensors under this layout
            name = Candidate(layout, r, 0, "").name
            notes.append(f"{name}: not weighed: {e}")
            print(f"[recipe] {name}: not weighed: {e}", flush=True)

    def weigh_one(layout: Layout, r: str, judged: list[int]) -> None:
        base = point_config(cfg, Layout(layout.zero_stage), r, 1)
        # what the predictor may be off by where no run confirms the fit: the layout's own (tp and pp unmeasured)
        margin = planning_margin(point_config(cfg, layout, r, 1)).frac
        mbs_at = largest_mbs_by_gpus(base, judged, gbs_samples, sweep_dir, layout, margin)
        fit = next((n for n in judged if mbs_at[n] >= 1), None)
        name = Candidate(layout, r, 0, "").name
        if fit is None:
            notes.append(f"{name}: not even mbs=1 fits per rank at any GPU count up to {judged[-1]}")
            return
        how = f"predicted ({predictor_name(cfg)}): no {hw.name} device at hand"
        if layout.pp > 1:  # the engine's stages are not measured by the recipe: a pipelined row is predicted
            how = "predicted (analytic, per stage): pipeline stages are not measured by the recipe"
        elif at_hand >= fit:  # confirmed on the devices at hand, at the fewest GPUs it fits on
            confirmed = find_mbs(
                point_config(cfg, layout.at(fit) or Layout(layout.zero_stage, fit), r, 1),
                max_mbs=gbs_samples // fit,
                # the built-in family's analytic figure is its trace's within a few %; a model one brings is traced
                # (on the devices at hand a whole trace is cheap, and its calibrated figure is off where the step's
                # peak moves between phases with the mbs: +31% at mbs 14 of a 2-block model)
                traced=not family_of(cfg.model).closed_form,
                launch_point=launch,
                traces_in=sweep_dir,
            )
            mbs_at = _scaled(mbs_at, fit, confirmed.mbs)
            how = confirmed.note + ("" if fit == 1 else f" at dp={fit}")
        if mbs_at[fit] < 1:
            notes.append(f"{name}: not even mbs=1 fits at {fit} GPU(s) ({how})")
            return
        found.append(Candidate(layout, r, mbs_at[fit], how, tuple(sorted(mbs_at.items()))))
        where = "one device" if fit == 1 else f"{fit} GPUs (sharded)"
        print(f"[recipe] {name}: largest mbs {mbs_at[fit]} on {where} ({how})", flush=True)

    for layout, r in ((layout, r) for z in zero for r in recompute for layout in layouts(cfg, z, gpus)):
        weigh(layout, r, judged)
    degrees, said = pipeline_decision(cfg, found, gpus, gbs_samples, pp)
    notes.append(said)
    top = max(gpus)
    for p in degrees:  # past what ZeRO and tp within a node fit, or past the batch's samples: pipeline stages
        for z in (z for z in zero if z >= ZeroStage.GRADIENTS or widest.tp == 1):
            for r in recompute:
                weigh(Layout(z, tp=widest.tp, pp=p), r, sorted({*(2**k for k in range(top.bit_length())), *gpus}))
    if not found:
        notes.append(fits_from(cfg, zero, recompute))
    return found


def _scaled(mbs_at: dict[int, int], at: int, confirmed: int) -> dict[int, int]:
    """The predicted mbs per count with the count `at` set to what runs confirmed, and the larger counts lowered in
    proportion when the runs found less room than predicted."""
    predicted = mbs_at[at]
    factor = confirmed / predicted if predicted and confirmed < predicted else 1.0
    return {n: confirmed if n == at else (int(m * factor) if n > at else m) for n, m in mbs_at.items()}


def fits_from(cfg: ExperimentConfig, zero: list[int], recompute: list[str], most: int = 2**20) -> str:
    """Where a model that fits at no requested count would start to fit: per ZeRO stage and recompute setting, the
    fewest GPUs (powers of two) at which mbs=1 fits per rank, whatever the batch."""
    starts = []
    for z in zero:
        for r in recompute:
            layout = Layout(z)
            counts = [2**k for k in range(most.bit_length()) if layout.zero_stage > ZeroStage.NONE or k == 0]
            base = point_config(cfg, layout, r, 1)
            mbs_at = largest_mbs_by_gpus(base, counts, most, margin=planning_margin(base).frac)
            n: Optional[int] = next((n for n in counts if mbs_at[n] >= 1), None)
            starts.append(f"{layout.kind} recompute {r} " + (f"from {n} GPUs" if n else "at no count"))
    return f"{cfg.model.name} fits on no GPU count the batch can use; it would start to fit: {'; '.join(starts)}"
