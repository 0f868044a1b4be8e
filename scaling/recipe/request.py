"""What `scaling recipe` is asked (`RecipeRequest`), and whether it can be answered (`check`): the batch in whole
sequences, the smallest point valid, a model the user brings within its contract, a device capacity to fit against.
Each refusal is one line naming the field, the value and what would be valid, before anything runs."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Optional

from scaling.core.batch import BatchError, nearest_whole_batch
from scaling.core.enums import Recompute, ZeroStage
from scaling.core.layout import Layout
from scaling.core.schema import ExperimentConfig
from scaling.core.validate import InvalidConfig, validate
from scaling.model.family import checked
from scaling.perf.knee import DEFAULT_THRESHOLD
from scaling.predictor.prescreen import capacity_bytes
from scaling.recipe.candidates import point_config


class RecipeError(ValueError):
    """A request the recipe cannot answer, in one line."""


@dataclass(frozen=True)
class RecipeRequest:
    """What `scaling recipe` is asked: the batch, the GPU counts and the choices to weigh."""

    gbs_tokens: int
    """Target global batch in tokens (rounded to the nearest whole number of sequences)."""
    gpus: list[int]
    """GPU counts to answer for."""
    zero: list[int] = field(default_factory=lambda: [int(z) for z in ZeroStage])
    """ZeRO stages to weigh (default every stage)."""
    recompute: list[str] = field(default_factory=lambda: [str(r) for r in Recompute])
    """train.recompute settings to weigh (default every setting)."""
    threshold: float = DEFAULT_THRESHOLD
    """Efficiency below which DP stops paying off."""
    tokens: Optional[int] = None
    """Tokens to train on (the rows' time and GPU-hours), or None."""
    max_grad_acc: int = 16
    """A measured point runs at most this many micro-steps (a larger grad_acc is extrapolated)."""
    draws: int = 200
    """Bootstrap draws of each band."""
    assume_mfu: Optional[float] = None
    """MFU to plan with where nothing is measured on the hardware (None: its measured points, conf/mfu/)."""
    pp: list[int] = field(default_factory=list)
    """Pipeline stages to weigh whatever the need (empty: 2, 4, 8, 16 where nothing else fits or the batch runs out
    of samples for dp; scaling.recipe.candidates.pipeline_decision)."""

    @classmethod
    def default(cls, name: str) -> Any:
        """A field's default: the one place the command line's defaults come from."""
        f = next(f for f in fields(cls) if f.name == name)
        return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def check(cfg: ExperimentConfig, request: RecipeRequest) -> int:
    """The global batch in whole sequences of the request, or RecipeError saying why it cannot be answered."""
    try:
        gbs_samples = nearest_whole_batch(request.gbs_tokens, cfg.train.seq_len)
    except BatchError as e:
        raise RecipeError(str(e).replace("gbs_tokens", "--gbs-tokens")) from None
    try:  # the smallest point of the recipe: seq_len within the model, heads, precision, the host's cores
        validate(point_config(cfg, Layout(request.zero[0]), request.recompute[0], 1))
        checked(cfg.model, cfg.train.seq_len)  # the model's contract (a model the user brings: on fake tensors)
    except InvalidConfig as e:
        raise RecipeError(str(e)) from None
    if capacity_bytes(cfg.hardware) is None:
        raise RecipeError(
            "hardware.memory_gb=null: the recipe needs a device capacity to find the largest mbs, e.g. "
            "hardware=h100, or hardware.memory_gb=0.05 for an emulated device on CPU"
        )
    return gbs_samples
