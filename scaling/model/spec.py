"""What every model family answers to (torchtitan's model spec): how the engine builds, splits, recomputes, shards and
initialises its module, what the driver and the performance model count of it (`counted`, `shape`) and its
tensor-parallel plan. Each family (scaling.model.llama, scaling.model.custom, scaling.model.hf) subclasses `Family` in
its folder; scaling.model.family is the registry that picks one for a `model` config. `logits_of` is the contract of
every forward. torch is imported only by the methods that build, so the driver counts the built-in family without it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ContextManager, Optional

from scaling.core.model_group import ModelConfig, ModelError, ModelGroup, tp_degrees_dividing
from scaling.model.shape import Counted, ModelShape

if TYPE_CHECKING:
    import torch
    from torch import nn


class Family(ABC):
    """A model config and how its module is built, split into blocks, recomputed, initialised and counted."""

    closed_form: bool = False
    """Its counts and memory follow from its config in closed form (the analytic predictor and the step model's own
    shapes); else it is counted by torch's FlopCounterMode and traced on fake tensors, and its record keeps its shape
    (derived.model)."""

    tp_outputs_owned: bool = True
    """Under tensor parallelism a rowwise module's output is a tensor of its own, not the view DTensor's `to_local()`
    gives (scaling.engine.tensor_parallel: a forward may add to it in place, as Falcon's does); a family whose forward
    never does keeps the view."""

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    @abstractmethod
    def claims(cls, config: ModelGroup) -> bool:
        """Whether this family builds the `model` config (the registry asks each in turn)."""

    def load_code(self) -> None:  # noqa: B027 (the built-in family's code is the project's: nothing to import)
        """Import the model's code without building it (a rank does, before its memory baseline)."""

    def code(self) -> Optional[str]:
        """The fingerprint of the user's code that makes the model (scaling.model.custom.code); None: the project's."""
        return None

    @abstractmethod
    def sizes(self) -> tuple[Any, Any]:
        """(vocab_size, max_seq_len): the vocabulary the data draws tokens from and the longest sequence (None: none)."""

    def vocab_size(self) -> int:
        """The vocabulary the data draws tokens from."""
        return int(self.sizes()[0])

    def longest_name(self) -> str:
        """Where the longest sequence is set, as a refusal names it."""
        return "model.max_seq_len"

    @abstractmethod
    def build(self, device: torch.device | str) -> nn.Module:
        """The module with its parameters on `device` ("meta": shapes only)."""

    @abstractmethod
    def blocks(self, module: nn.Module) -> list[nn.Module]:
        """The blocks, in order: what is recomputed, compiled and sharded one by one."""

    @abstractmethod
    def recompute(self, module: nn.Module, blocks: list[nn.Module], recompute: str, every: int) -> list[nn.Module]:
        """Checkpoint every `every`-th block under `recompute` (selective or full; scaling.model.checkpoint); returns
        the blocks as they now run (to compile and shard)."""

    def materialise(self, module: nn.Module, device: torch.device) -> None:
        """Allocate what this rank owns of the module built on meta, ties restored, every float NaN until initialised."""
        from scaling.model.custom.init import materialise

        materialise(module, device)

    @abstractmethod
    def initialise(self, module: nn.Module, seed: int) -> None:
        """Seeded init of the materialised (possibly sharded) module: the same weights for every dp and stage."""

    def check_initialised(self, module: nn.Module, group: Any = None) -> None:
        """ModelError naming every parameter and buffer that initialisation left as `materialise` made it (NaN), agreed
        over `group` (the ranks that hold the same tensors: every rank, or a pipeline stage's)."""
        from scaling.model.custom.init import raise_if_unwritten

        raise_if_unwritten(self.config.name, module, group)

    def as_on_real_tensors(self) -> ContextManager[None]:
        """While inside, its forward on fake tensors (the FLOP count, the traced predictor) runs as on real ones where
        its library would otherwise take another path (scaling.model.hf.causal_lm.masks_as_on_real_tensors)."""
        import contextlib

        return contextlib.nullcontext()

    def attention_of(self, module: nn.Module) -> Optional[str]:
        """The attention implementation the counted module runs, when its library chooses one (None: its own)."""
        return None

    @abstractmethod
    def counted(self, seq_len: int) -> Counted:
        """Its size, FLOPs and parameter tensors at one sequence length; ModelError if it breaks the contract."""

    def builtin_config(self, seq_len: int) -> Optional[ModelConfig]:
        """The built-in family's `model` config with its shapes, where the built-in formulas describe its matrices
        (a Hugging Face config of a Llama-like family, scaling.model.hf.builtin_shapes); None: they do not."""
        return None

    def shape(self, seq_len: int) -> ModelShape:
        """Its parameter tensors and blocks, as the step model and the extrapolation take any model."""
        counted = self.counted(seq_len)
        return ModelShape.cached(self.config.name, counted.tensors, counted.n_blocks)

    def stage_costs(self, seq_len: int) -> tuple[list[float], float, float]:
        """What a pipeline split weighs (scaling.core.stages.split_blocks): each block's FLOPs per token, the embedding's
        (with the first stage) and the final norm's and head's (with the last). Here from the counted figures: the
        head is the last parameter tensor outside the blocks when that is a matrix (6 FLOPs per weight per token), the
        embedding lookup costs none, and the blocks share the rest equally (they are one class repeated)."""
        counted = self.counted(seq_len)
        roots = [t for t in counted.tensors if not t[1]]
        head = 6.0 * roots[-1][2] * roots[-1][3] if len(roots) > 1 and roots[-1][3] > 1 else 0.0
        block = (counted.flops_per_token - head) / counted.n_blocks
        return [block] * counted.n_blocks, 0.0, head

    def stages(self, seq_len: int, count: int) -> list[range]:
        """The blocks of each of `count` pipeline stages (pp × pp_virtual), balanced by `stage_costs`: the one split
        the engine runs and the predictors weigh (scaling.core.stages.split_blocks)."""
        from scaling.core.stages import split_blocks

        blocks, first, last = self.stage_costs(seq_len)
        return split_blocks(blocks, count, first_extra=first, last_extra=last)

    @abstractmethod
    def pipeline_stage(self, module: nn.Module, blocks: range, first: bool, last: bool) -> nn.Module:
        """The module of one pipeline stage of `module` (built on meta): its `blocks`, with the embedding when `first`
        and the final norm and head when `last`; tokens (B, T) in on the first stage, hidden states between stages,
        logits out of the last. ModelError where the family cannot cut its forward between blocks."""

    def stage_root(self, stage: nn.Module) -> nn.Module:
        """What a stage's tensor-parallel plan and recompute address, by the model's own module names (the stage)."""
        return stage

    def stage_blocks(self, stage: nn.Module) -> list[nn.Module]:
        """The blocks a stage runs, in order (what is compiled and sharded one by one)."""
        return self.blocks(self.stage_root(stage))

    def initialise_stages(self, module: nn.Module, stages: list[nn.Module], seed: int) -> None:
        """Seeded init of this rank's materialised stages of `module`: the values they have at pp 1. Here the whole
        module's `initialise` (what a stage does not hold is left on meta)."""
        self.initialise(module, seed)

    def check_pp(self, stages: int, n_blocks: int) -> None:
        """ModelError when the model cannot be cut into `stages` pipeline stages: fewer blocks than stages."""
        if stages > n_blocks:
            raise ModelError(
                f"{stages} pipeline stages (parallel.pp x pp_virtual) but model {self.config.name!r} has {n_blocks} "
                f"blocks: each stage holds at least one block; try pp <= {n_blocks}"
            )

    def tp_widths(self) -> dict[str, int]:
        """What tensor parallelism splits evenly: heads, key/value heads and widths, by name (empty: unknown)."""
        return {}

    @abstractmethod
    def tp_plan(self) -> dict[str, str]:
        """Tensor parallelism: module-name patterns -> colwise | rowwise | colwise_rep | rowwise_rep | embedding
        (scaling.core.model_group.TP_STYLES); ModelError when the model has none."""

    def check_tp(self, tp: int) -> None:
        """ModelError when tensor parallelism of degree `tp` cannot run the model: it has no plan (the refusal names
        the key to add), or the degree does not split one of its heads or widths evenly."""
        self.tp_plan()
        widths = self.tp_widths()
        split = [f"{name}={value}" for name, value in widths.items() if value % tp]
        if split:
            raise ModelError(
                f"parallel.tp={tp} does not divide {', '.join(split)} of model {self.config.name!r}: tensor "
                f"parallelism splits heads and widths evenly; try tp in {tp_degrees_dividing(widths)}"
            )


def logits_of(out: Any) -> torch.Tensor:
    """The logits of a forward: the tensor itself, the first of a tuple (`(logits, loss)`, as single-file GPTs return),
    a dict's "logits", or an output object's `.logits` (as Hugging Face models return); ModelError naming what it
    returned otherwise."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    logits = out.get("logits") if isinstance(out, dict) else getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise ModelError(
        f"its forward returned a {type(out).__name__}, not logits: return the (B, T, vocab_size) tensor, a tuple whose "
        "first element it is, a dict with it under 'logits' or an object with it as .logits"
    )


def raised_at(e: BaseException) -> str:
    """' (at FILE:LINE)': the innermost line of the model's own code the exception passed through (not the standard
    library's, an installed package's or this project's); '' where none did."""
    import os
    import sysconfig
    import traceback

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # scaling/
    skip = {sysconfig.get_path(k) for k in ("stdlib", "purelib", "platlib")} | {package}
    skip_dirs = tuple(os.path.realpath(d) + os.sep for d in skip if d)
    own = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if not os.path.realpath(f.filename).startswith(skip_dirs) and "site-packages" not in f.filename
    ]
    return f" (at {os.path.basename(own[-1].filename)}:{own[-1].lineno})" if own else ""
