"""The one interface every model family answers to: what the engine builds and shards (`build`, `blocks`,
`recompute`, `materialise`, `initialise`, `check_initialised`), what a rank imports before its memory baseline
(`load_code`), what the driver and the performance model count (`counted`; `checked` is that with the contract's
refusal as every command words it) and the fingerprint of a user's model code (`code`). `family_of` picks the family
of a `model` config: the built-in Llama decoder (scaling.model.llama) or a model the user brings
(scaling.model.custom; a Hugging Face config is one, built by scaling.model.hf). torch is imported only by the
methods that build, so the driver counts the built-in family without it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Optional, Union

from scaling.core.model_group import HF_TARGET, CustomModel, ModelConfig, tp_degrees_dividing
from scaling.core.validate import InvalidConfig
from scaling.model.shape import Counted

if TYPE_CHECKING:
    import torch
    from torch import nn


class ModelError(ValueError):
    """A model the user brings that cannot be used: one line naming the field, the value and what would be valid."""


class Family(ABC):
    """A model config and how its module is built, split into blocks, recomputed, initialised and counted."""

    config: Union[ModelConfig, CustomModel]

    def load_code(self) -> None:  # noqa: B027 (the built-in family's code is the project's: nothing to import)
        """Import the model's code without building it (a rank does, before its memory baseline)."""

    def code(self) -> Optional[str]:
        """The fingerprint of the user's code that makes the model (scaling.model.custom.code); None: the project's."""
        return None

    @abstractmethod
    def vocab_size(self) -> int:
        """The vocabulary the data draws tokens from."""

    @abstractmethod
    def build(self, device: torch.device | str) -> nn.Module:
        """The module with its parameters on `device` ("meta": shapes only)."""

    @abstractmethod
    def blocks(self, module: nn.Module) -> list[nn.Module]:
        """The blocks, in order: what is recomputed, compiled and sharded one by one."""

    @abstractmethod
    def recompute(self, module: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
        """Checkpoint every block's activations; returns the blocks as they now run (to compile and shard)."""

    def materialise(self, module: nn.Module, device: torch.device) -> None:
        """Allocate what this rank owns of the module built on meta, ties restored, every float NaN until initialised."""
        from scaling.model.custom.init import materialise

        materialise(module, device)

    @abstractmethod
    def initialise(self, module: nn.Module, seed: int) -> None:
        """Seeded init of the materialised (possibly sharded) module: the same weights for every dp and stage."""

    def check_initialised(self, module: nn.Module) -> None:
        """ModelError naming every parameter and buffer that initialisation left as `materialise` made it (NaN)."""
        from scaling.model.custom.init import raise_if_unwritten

        raise_if_unwritten(self.config.name, module)

    @abstractmethod
    def counted(self, seq_len: int) -> Counted:
        """Its size, FLOPs and parameter tensors at one sequence length; ModelError if it breaks the contract."""

    def tp_widths(self) -> dict[str, int]:
        """What tensor parallelism splits evenly: heads, key/value heads and widths, by name (empty: unknown)."""
        return {}

    @abstractmethod
    def tp_plan(self) -> dict[str, str]:
        """Tensor parallelism: module-name patterns -> colwise | rowwise | colwise_rep | rowwise_rep | embedding
        (scaling.core.model_group.TP_STYLES); ModelError when the model has none."""


class Llama(Family):
    """The built-in decoder: closed forms for its counts (scaling.model.llama)."""

    def __init__(self, config: ModelConfig) -> None:
        from scaling.model.llama.args import ModelArgs

        self.config, self.args = config, ModelArgs.of(config)

    def vocab_size(self) -> int:
        return self.args.vocab_size

    def build(self, device: torch.device | str) -> nn.Module:
        from scaling.model.llama.decoder import Transformer

        return Transformer(self.args, device=device)

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        return list(module.layers)

    def recompute(self, module: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
        module.set_recompute(True)  # the checkpoint sits inside each block's forward
        return blocks

    def initialise(self, module: nn.Module, seed: int) -> None:
        module.init_weights(seed)

    def tp_plan(self) -> dict[str, str]:
        from scaling.model.llama.decoder import TP_PLAN

        return dict(TP_PLAN)

    def counted(self, seq_len: int) -> Counted:
        from scaling.model.llama.args import param_count, param_shapes
        from scaling.model.llama.flops import flops_per_token, recomputed_flops_per_token

        return Counted(
            n_params=param_count(self.args),
            flops_per_token=flops_per_token(self.args, seq_len),
            recomputed_flops_per_token=recomputed_flops_per_token(self.args, seq_len),
            block="Block",
            n_blocks=self.args.n_layers,
            tensors=param_shapes(self.config),
            source="closed_form",
        )


class Custom(Family):
    """A model the user brings (their module, or a Hugging Face config): counted on fake tensors."""

    def __init__(self, config: CustomModel) -> None:
        self.config = config

    def load_code(self) -> None:
        from scaling.model.custom.build import load_code

        load_code(self.config)

    def code(self) -> Optional[str]:
        from scaling.model.custom.code import model_code

        return model_code(self.config)

    def vocab_size(self) -> int:
        from scaling.model.custom.build import sizes

        return int(sizes(self.config)[0])

    def build(self, device: torch.device | str) -> nn.Module:
        from scaling.model.custom.build import build

        return build(self.config, device)

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        from scaling.model.custom.build import blocks

        return blocks(self.config, module)

    def recompute(self, module: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
        from scaling.model.custom.build import wrap_recompute

        return wrap_recompute(module, type(blocks[0]))

    def initialise(self, module: nn.Module, seed: int) -> None:
        from scaling.model.custom.build import initialise

        initialise(self.config, module, seed)

    def counted(self, seq_len: int) -> Counted:
        from scaling.model.custom.count import count

        return count(self.config, seq_len)

    def tp_plan(self) -> dict[str, str]:
        from scaling.model.custom.build import tp_plan

        return tp_plan(self.config)

    def tp_widths(self) -> dict[str, int]:
        if self.config.target != HF_TARGET:
            return {}
        from scaling.model.hf.causal_lm import hf_widths

        return hf_widths(**self.config.kwargs)


def family_of(model: Union[ModelConfig, CustomModel]) -> Family:
    """The family of a `model` config group."""
    return Custom(model) if isinstance(model, CustomModel) else Llama(model)


def _check_plan_matches(family: Family, model: CustomModel) -> None:
    """Every pattern of the file's tp_plan names a submodule of the model as built (on meta): ModelError naming the
    patterns that match none and how the submodules are named."""
    import fnmatch

    names = [name for name, _ in family.build("meta").named_modules() if name]
    unmatched = [p for p in model.tp_plan or {} if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        raise ModelError(
            f"model.tp_plan: {', '.join(repr(p) for p in unmatched)} matches no submodule of model {model.name!r}; "
            f"its submodules are named {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
        )


def checked(model: Union[ModelConfig, CustomModel], seq_len: int, tp: int = 1) -> Counted:
    """`counted`, with the contract checked on the way, as every command checks it before any process starts (`run`,
    `predict`, `find-mbs`, a sweep's forecast), and with tensor parallelism its plan and widths: InvalidConfig, one
    line, for a model that breaks it."""
    try:
        family = family_of(model)
        if tp > 1:
            family.tp_plan()  # a model without a plan is refused naming the key to add
            if isinstance(model, CustomModel) and model.tp_plan is not None:
                _check_plan_matches(family, model)
            widths = family.tp_widths()
            split = [f"{name}={value}" for name, value in widths.items() if value % tp]
            if split:
                raise ModelError(
                    f"parallel.tp={tp} does not divide {', '.join(split)} of model {model.name!r}: tensor parallelism "
                    f"splits heads and widths evenly; try tp in {tp_degrees_dividing(widths)}"
                )
        return family.counted(seq_len)
    except ModelError as e:
        raise InvalidConfig([str(e)]) from e
