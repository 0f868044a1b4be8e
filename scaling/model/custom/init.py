"""What initialisation writes, proven: every parameter and buffer holds a value before the first step, and weight
ties survive materialisation. A rank fills what `to_empty` allocated with NaN, initialises, and refuses the point
naming every tensor still NaN (`materialise`, `raise_if_unwritten`); the driver proves the same on fake tensors
before any rank starts (`Writes`), by following which storages receive values. Which initialisation runs is
`init_kind`'s choice (docs/own-project.md). torch and the standard library only.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import TorchDispatchMode

from scaling.core.model_group import ModelError

INIT_WEIGHTS, OWN_INIT, RESET_PARAMETERS = "init_weights", "own_init", "reset_parameters"
"""How a model is initialised after materialisation: its `init_weights()`; its own `__init__` run once more for
real on the CPU and copied in (what building on meta loses); each submodule's `reset_parameters()`."""
OWN_INIT_MAX_BYTES = 4 * 2**30
"""The largest model (parameters and buffers) whose own `__init__` is run for real on each rank's CPU to honour the
init it applies; a larger one without `init_weights()` gets each submodule's `reset_parameters()`."""
NAMED_AT_MOST = 8
"""Tensors an error names before it says how many more there are."""


def _tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every distinct parameter and buffer, by its first name."""
    yield from module.named_parameters()
    yield from module.named_buffers()


def init_kind(module: nn.Module) -> str:
    """Which initialisation the engine runs on `module` (a meta or fake one will do): its `init_weights()` if it has
    one, else its own `__init__` when the model is at most OWN_INIT_MAX_BYTES, else each `reset_parameters()`."""
    if callable(getattr(module, "init_weights", None)):
        return INIT_WEIGHTS
    size = sum(t.numel() * t.element_size() for _, t in _tensors(module))
    return OWN_INIT if size <= OWN_INIT_MAX_BYTES else RESET_PARAMETERS


def tied(module: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The parameters registered under more than one name, each as its (owner, attribute) places: what `to_empty`
    unties (it gives every owner a parameter of its own) and `restore_ties` ties again."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for owner in module.modules():
        for attr, param in owner._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((owner, attr))
    return [group for group in places.values() if len(group) > 1]


def restore_ties(groups: list[list[tuple[nn.Module, str]]]) -> None:
    """Register the first place's parameter at every other place of its group (FSDP2 keeps ties itself: no-op)."""
    for (first, first_attr), *others in groups:
        for owner, attr in others:
            owner._parameters[attr] = first._parameters[first_attr]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "device_mesh") else t


@torch.no_grad()
def materialise(module: nn.Module, device: torch.device | str) -> None:
    """Allocate what this rank owns of a module built on meta (`to_empty`), tie again what was tied, and fill every
    floating-point tensor with NaN, so that anything initialisation leaves unwritten is seen (`raise_if_unwritten`)."""
    groups = tied(module)
    module.to_empty(device=device)
    restore_ties(groups)
    for _, t in _tensors(module):
        if t.is_floating_point():
            _local(t).fill_(math.nan)


@torch.no_grad()
def raise_if_unwritten(name: str, module: nn.Module, group: Any = None) -> None:
    """Raise naming every floating-point parameter and buffer that still holds NaN after initialisation (on any rank
    of `group`, the ranks that hold these tensors, every rank by default: they all name the same ones)."""
    named = [(n, t) for n, t in _tensors(module) if t.is_floating_point()]
    if not named:
        return
    flags = torch.stack([torch.isnan(_local(t)).any() for _, t in named]).to(torch.int32)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    unwritten = [n for (n, _), bad in zip(named, flags.tolist()) if bad]
    if unwritten:
        raise ModelError(unwritten_line(f"model {name!r}", unwritten, len(named), init_kind(module)))


def unwritten_line(model: str, unwritten: list[str], of: int, kind: str) -> str:
    """One line naming what initialisation (`kind`) left without a value in `model` (its words), and the fix."""
    listed = ", ".join(unwritten[:NAMED_AT_MOST]) + (
        f" and {len(unwritten) - NAMED_AT_MOST} more" if len(unwritten) > NAMED_AT_MOST else ""
    )
    by = {
        INIT_WEIGHTS: "its init_weights()",
        OWN_INIT: "its own __init__",
        RESET_PARAMETERS: "each submodule's reset_parameters() (it is larger than the own-init limit)",
    }[kind]
    return (
        f"{model}: {len(unwritten)} of {of} parameters and buffers get no value from {by}: {listed}: give "
        "each such module a reset_parameters() that writes them, or the model an init_weights() that writes every "
        "parameter and buffer (docs/own-project.md)"
    )


class Writes(TorchDispatchMode):
    """Follows which storages hold values, on fake or meta tensors: an op's new outputs hold values when every
    tensor it read did (`empty` and its kind make none); an in-place op's target receives values when every other
    tensor it read held them and its writes cover the target's storage. Build a model inside, then ask
    `unwritten_after` what the engine's initialisation would leave without a value."""

    EMPTY = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})

    def __init__(self) -> None:
        super().__init__()
        self.valued: set[int] = set()
        self.covered: dict[int, int] = {}

    @staticmethod
    def _key(t: torch.Tensor) -> int:
        return t.untyped_storage()._cdata  # what a tensor's aliases and views share

    def _holds(self, t: torch.Tensor) -> bool:
        """Whether a tensor an op reads holds values: one this mode saw written, or a real one (a constant that
        `torch.tensor(data)` made outside the fake mode and lifts into it)."""
        return self._key(t) in self.valued or not (is_fake(t) or t.is_meta)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        given = [*args, *(kwargs.get(a.name) for a in schema.arguments[len(args) :])]
        written, read = [], []
        for arg, value in zip(schema.arguments, given):
            for t in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(t, torch.Tensor):
                    (written if arg.alias_info is not None and arg.alias_info.is_write else read).append(t)
        values = func.overloadpacket.__name__ not in self.EMPTY and all(self._holds(t) for t in read)
        for t in written if values else []:
            key = self._key(t)
            self.covered[key] = self.covered.get(key, 0) + t.numel() * t.element_size()
            if self.covered[key] >= t.untyped_storage().nbytes():
                self.valued.add(key)
        inputs = {self._key(t) for t in (*read, *written)}
        for ret, value in zip(schema.returns, out if isinstance(out, (list, tuple)) else [out]):
            if not isinstance(value, torch.Tensor):
                continue
            key = self._key(value)
            # a new storage (a freed one's address), also where the schema says alias but the mode made another: the
            # fake tensor `lift_fresh` makes of a real constant
            if ret.alias_info is None or key not in inputs:
                self.covered.pop(key, None)
                (self.valued.add if values else self.valued.discard)(key)
        return out

    def unwritten_after(self, module: nn.Module, initialise: Callable[[nn.Module], Any]) -> tuple[str, list[str]]:
        """The init kind of a module built inside, and the names of its parameters and buffers that hold no value
        after the engine's initialisation (`initialise(module)`; with OWN_INIT what `__init__` wrote stays)."""
        kind = init_kind(module)
        if kind != OWN_INIT:
            self.valued.clear()  # what __init__ wrote on meta is lost there
            self.covered.clear()
            with self:
                initialise(module)
        return kind, [n for n, t in _tensors(module) if self._key(t) not in self.valued]
