"""A module the user brings (`_target_`) as a family (scaling.model.spec): imported and built by build.py, counted and
its contract checked on fake tensors by count.py, initialised as init.py proves, fingerprinted by code.py. Its
tensor-parallel plan is its file's `tp_plan`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional

from scaling.core.model_group import CustomModel, ModelError, ModelGroup
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

    def pipeline_stage(self, module: nn.Module, blocks: range, first: bool, last: bool) -> nn.Module:
        """Its forward cut between its blocks by stand-ins and hooks (scaling.model.custom.stage)."""
        from scaling.model.custom.stage import CutStage

        every = self.blocks(module)
        self._refuse_ties(module)
        return CutStage(module, every, blocks, first, last, self._block_output())

    def _block_output(self) -> Any:
        """How its blocks' output carries the hidden states (scaling.model.custom.stage.output_form), read on a
        model built on fake tensors."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        from scaling.model.custom.stage import output_form

        with FakeTensorMode(), self.as_on_real_tensors():
            fake = self.build("cpu")
            return output_form(self.config.name, fake, self.blocks(fake)[0])

    def _refuse_ties(self, module: nn.Module) -> None:
        from scaling.core.model_group import ModelError
        from scaling.model.custom.init import tied

        groups = tied(module)
        if groups:
            names = ", ".join(".".join(filter(None, (type(o).__name__, a))) for o, a in groups[0])
            raise ModelError(
                f"model {self.config.name!r}: its weights tied across modules ({names}) would sit on two pipeline "
                "stages, whose gradients are not summed between them: use parallel.pp=1 (or untie them)"
            )

    def stage_root(self, stage: nn.Module) -> nn.Module:
        return stage.model

    def stage_blocks(self, stage: nn.Module) -> list[nn.Module]:
        """The blocks the stage kept (of the model's block class: its stand-ins are not)."""
        return [m for m in stage.model.modules() if isinstance(m, stage.block_class)]

    def initialise_stages(self, module: nn.Module, stages: list[nn.Module], seed: int) -> None:
        """The whole model built on the CPU as one rank builds it (on meta, then materialised) and initialised as one
        rank initialises it, then each stage's part copied in (scaling.model.custom.stage)."""
        import torch

        from scaling.model.custom.build import _full_parameters
        from scaling.model.custom.stage import copy_values

        real = self.build("meta")
        self.materialise(real, torch.device("cpu"))
        self.initialise(real, seed)
        for stage in stages:
            copy_values(real, stage.model, _full_parameters)

    def check_pp(self, stages: int, n_blocks: int) -> None:
        """As every family, and what cutting needs: no weight tied across modules, blocks that return their hidden
        states (read on fake tensors)."""
        super().check_pp(stages, n_blocks)
        self._refuse_ties(self.build("meta"))
        self._block_output()

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
        key = (json.dumps(self.config.to_dict(), sort_keys=True, default=str), tp)
        if key not in _CHECKED_TP:  # each model and degree once per process: the check builds the model on meta
            try:
                self._check_tp(tp)
                _CHECKED_TP[key] = None
            except ModelError as e:
                _CHECKED_TP[key] = e
        if _CHECKED_TP[key] is not None:
            raise _CHECKED_TP[key]

    def _check_tp(self, tp: int) -> None:
        from scaling.model.custom.plan import check_plan

        plan = self.tp_plan()
        own = self.config.tp_plan is not None
        where = "model.tp_plan" if own else f"the tensor-parallel plan of {self.config.source}"
        check_plan(repr(self.config.name), self.build("meta"), plan, where, every=own)
        super().check_tp(tp)


_CHECKED_TP: dict[tuple[str, int], Optional[ModelError]] = {}
"""`check_tp`'s answer by (model config, degree): None, or the refusal it raised."""
