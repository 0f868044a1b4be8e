"""The registry of model families (torchtitan's model specs): each family (scaling.model.spec.Family) builds, splits,
initialises, counts and plans tensor parallelism for the `model` configs it claims. `family_of` picks the first that
claims a config: a Hugging Face config (scaling.model.hf), a module the user brings (scaling.model.custom), the
built-in Llama decoder (scaling.model.llama). A new family is one class in its folder and one entry in FAMILIES.
`checked` is `counted` with the contract's refusal as every command words it.
"""

from __future__ import annotations

import fnmatch

from scaling.core.model_group import ModelError, ModelGroup, tp_degrees_dividing
from scaling.core.validate import InvalidConfig
from scaling.model.custom.family import OwnModule
from scaling.model.hf.family import HuggingFace
from scaling.model.llama.family import Llama
from scaling.model.shape import Counted
from scaling.model.spec import Family

FAMILIES: tuple[type[Family], ...] = (HuggingFace, OwnModule, Llama)
"""Every family, the most specific first: the first that claims a `model` config builds it."""


def family_of(model: ModelGroup) -> Family:
    """The family of a `model` config group."""
    for family in FAMILIES:
        if family.claims(model):
            return family(model)
    raise ModelError(f"model {getattr(model, 'name', model)!r}: no family builds a {type(model).__name__}")


def _check_plan_matches(family: Family, plan: dict[str, str]) -> None:
    """Every pattern of the file's tp_plan names a submodule of the model as built (on meta): ModelError naming the
    patterns that match none and how the submodules are named."""
    names = [name for name, _ in family.build("meta").named_modules() if name]
    unmatched = [p for p in plan if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        raise ModelError(
            f"model.tp_plan: {', '.join(repr(p) for p in unmatched)} matches no submodule of model "
            f"{family.config.name!r}; its submodules are named {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
        )


def checked(model: ModelGroup, seq_len: int, tp: int = 1) -> Counted:
    """`counted`, with the contract checked on the way, as every command checks it before any process starts (`run`,
    `predict`, `find-mbs`, a sweep's forecast), and with tensor parallelism its plan and widths: InvalidConfig, one
    line, for a model that breaks it."""
    try:
        family = family_of(model)
        if tp > 1:
            family.tp_plan()  # a model without a plan is refused naming the key to add
            own_plan = getattr(model, "tp_plan", None)  # a plan the model file gives, checked against the module
            if own_plan is not None:
                _check_plan_matches(family, own_plan)
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
