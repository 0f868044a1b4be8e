"""A module the user brings (`_target_`) as a family (scaling.model.spec): imported and built by build.py, counted and
its contract checked on fake tensors by count.py, initialised as init.py proves, fingerprinted by code.py. Its
tensor-parallel plan is its file's `tp_plan`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from scaling.core.model_group import CustomModel, ModelGroup
from scaling.model.shape import Counted
from scaling.model.spec import Family

if TYPE_CHECKING:
    import torch
    from torch import nn


class OwnModule(Family):
    """A model the user brings: their module, counted on fake tensors."""

    config: CustomModel

    @classmethod
    def claims(cls, config: ModelGroup) -> bool:
        return isinstance(config, CustomModel)

    def load_code(self) -> None:
        from scaling.model.custom.build import load_code

        load_code(self.config)

    def code(self) -> Optional[str]:
        from scaling.model.custom.code import model_code

        return model_code(self.config)

    def sizes(self) -> tuple[Any, Any]:
        return self.config.vocab_size, self.config.max_seq_len

    def build(self, device: torch.device | str) -> nn.Module:
        from scaling.model.custom.build import build

        return build(self.config, device)

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        from scaling.model.custom.build import blocks

        return blocks(self.config, module)

    def recompute(self, module: nn.Module, blocks: list[nn.Module], recompute: str, every: int) -> list[nn.Module]:
        from scaling.model.custom.build import wrap_recompute

        return wrap_recompute(module, type(blocks[0]), recompute, every)

    def initialise(self, module: nn.Module, seed: int) -> None:
        from scaling.model.custom.build import initialise

        initialise(self.config, module, seed)

    def counted(self, seq_len: int) -> Counted:
        from scaling.model.custom.count import count

        return count(self, seq_len)

    def tp_plan(self) -> dict[str, str]:
        from scaling.model.custom.build import no_tp_plan

        if self.config.tp_plan is None:
            raise no_tp_plan(self.config)
        return dict(self.config.tp_plan)

    def check_tp(self, tp: int) -> None:
        """As every family, and its plan checked against the model as built on meta (scaling.model.custom.plan): every
        pattern of the file's `tp_plan` names a submodule it can split (a refusal names the pattern and what it could
        mean); of a plan the model brings (transformers'), the plan as a whole."""
        from scaling.model.custom.plan import check_plan

        plan = self.tp_plan()
        own = self.config.tp_plan is not None
        where = "model.tp_plan" if own else f"the tensor-parallel plan of {self.config.source}"
        check_plan(repr(self.config.name), self.build("meta"), plan, where, every=own)
        super().check_tp(tp)
