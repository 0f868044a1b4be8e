"""The registry of model families (torchtitan's model specs): each family (scaling.model.spec.Family) builds, splits,
initialises, counts and plans tensor parallelism for the `model` configs it claims. `family_of` picks the first that
claims a config: a Hugging Face config (scaling.model.hf), a module the user brings (scaling.model.custom), the
built-in Llama decoder (scaling.model.llama). A new family is one class in its folder and one entry in FAMILIES.
`checked` is `counted` with the contract's refusal as every command words it.
"""

from __future__ import annotations

from scaling.core.model_group import ModelError, ModelGroup
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


def checked(model: ModelGroup, seq_len: int, tp: int = 1, stages: int = 1, zero_stage: int = 0) -> Counted:
    """`counted`, with the contract checked on the way, as every command checks it before any process starts (`run`,
    `predict`, `find-mbs`, a sweep's forecast), with tensor parallelism its plan and widths, with pipeline stages
    (`stages`: pp × its virtual stages) whether it can be cut into them, and at ZeRO-2 and 3 (FSDP2) whether every
    parameter can be sharded: InvalidConfig, one line, for a model that breaks it."""
    try:
        family = family_of(model)
        counted = family.counted(seq_len)  # what is not a model at all (an encoder) is refused as such first
        if zero_stage >= 2 and counted.scalars:
            raise ModelError(
                f"parallel.zero_stage={zero_stage}: model {model.name!r} has 0-dim parameters FSDP2's fully_shard "
                f"cannot shard ({', '.join(counted.scalars)}): make each 1-D (shape (1,)), or use parallel.zero_stage "
                "0 or 1"
            )
        if tp > 1:
            family.check_tp(tp)
        if stages > 1:
            family.check_pp(stages, counted.n_blocks)
        return counted
    except ModelError as e:
        raise InvalidConfig([str(e)]) from e
