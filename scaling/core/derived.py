"""A point's `derived` block, typed once from validation to the record: `scaling.core.validate.validate` makes it
(the batch arithmetic and the world), the job adds what the model counts to (its parameters and FLOPs per token;
scaling.job.run), the record holds it, and the analysis, the report and W&B read its fields. Standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any, Mapping, Optional, get_args, get_type_hints

from scaling.core.field_meta import COLUMN

NOT_A_COLUMN = {COLUMN: None}
"""A field's metadata when it stays in the record and out of the analysis's table."""


@dataclass(kw_only=True)
class ParamTensors:
    """A model's parameter tensors in `parameters()` order, one entry per tensor in each list (what the step model's
    collectives are made of: scaling.model.shape.ModelShape.from_record)."""

    module: list[str]
    """`root` or `block` (scaling.model.shape.ROOT, BLOCK): the FSDP2 module that holds it."""
    rows: list[int]
    """Its dim 0 (what FSDP2 shards)."""
    cols: list[int]
    """The product of its other dims."""


@dataclass(kw_only=True)
class DerivedModel:
    """What a model the user brings is, counted on fake tensors (the built-in family's follows from its config)."""

    name: str = field(metadata=NOT_A_COLUMN)
    source: str = field(metadata=NOT_A_COLUMN)
    """What builds it: the target's dotted path."""
    block: str = field(metadata=NOT_A_COLUMN)
    """The block class's name."""
    n_blocks: int
    init: Optional[str] = field(default=None, metadata=NOT_A_COLUMN)
    """What initialised it: its init_weights(), its own __init__ run for real, or reset_parameters()."""
    attention: Optional[str] = field(default=None, metadata=NOT_A_COLUMN)
    """A Hugging Face model's attention implementation."""
    config_hash: str = field(metadata=NOT_A_COLUMN)
    """A hash of its config (two models of one name differ)."""
    param_tensors: ParamTensors


@dataclass(kw_only=True)
class Derived:
    """What a valid point's config implies: the batch arithmetic and the world (from validation), then the model's
    size and FLOPs per token (counted by the job: `counted`)."""

    gbs: int
    """Global batch in samples: mbs × grad_acc × dp."""
    gbs_tokens: int
    """gbs × seq_len."""
    grad_acc: int
    """Gradient-accumulation steps (`auto` resolved)."""
    world_size: int
    """Ranks (devices): dp × tp × pp (scaling.core.layout: Layout.world_size); tokens/s per GPU and MFU divide by it."""
    nnodes: int = field(default=1, metadata=NOT_A_COLUMN)
    """Nodes the ranks span (hardware.devices_per_node)."""
    n_params: Optional[int] = None
    """Distinct parameters (a tied weight once); None until the model is counted."""
    flops_per_token: Optional[float] = None
    """Model FLOPs per trained token, forward and backward: the numerator of MFU."""
    hw_flops_per_token: Optional[float] = None
    """The same with recomputation counted: the numerator of HFU."""
    flops_source: Optional[str] = field(default=None, metadata=NOT_A_COLUMN)
    """`counted` for a model the user brings (None: the built-in family's closed form)."""
    uncounted_ops: Optional[list[str]] = field(default=None, metadata=NOT_A_COLUMN)
    """Matmul-like operators the FLOP counter has no formula for (their FLOPs are missing from MFU)."""
    model: Optional[DerivedModel] = None
    """A model the user brings (None: the built-in family)."""

    def counted(self, n_params: int, flops_per_token: float, hw_flops_per_token: float, **model: Any) -> Derived:
        """This block with the model counted (and, for a model the user brings, `flops_source`, `uncounted_ops` and
        `model`)."""
        return replace(
            self, n_params=n_params, flops_per_token=flops_per_token, hw_flops_per_token=hw_flops_per_token, **model
        )

    def to_dict(self) -> dict[str, Any]:
        """The block as the record holds it (what is None is left out, as in records written before it was typed)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Derived:
        """A block read back (keys it does not know are left out)."""
        return _typed(cls, data)


def nested_block(kind: type, name: str) -> Optional[type]:
    """The dataclass a field of `kind` holds (Optional or not), None for a plain value."""
    hint = get_type_hints(kind)[name]
    return next((t for t in (get_args(hint) or (hint,)) if is_dataclass(t)), None)


def _typed(kind: type, data: Mapping[str, Any]) -> Any:
    """The dataclass `kind` of a plain dict, nested blocks typed too; keys it does not know are left out."""
    out = {}
    for f in fields(kind):
        if f.name in data:
            nested, value = nested_block(kind, f.name), data[f.name]
            out[f.name] = _typed(nested, value) if nested is not None and isinstance(value, Mapping) else value
    return kind(**out)
