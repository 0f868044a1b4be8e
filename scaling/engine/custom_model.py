"""A model the user brings (scaling.core.models.CustomModel), built, checked, initialised and counted the way the
engine needs it: their own `nn.Module` (`_target_`, a class or a factory imported from their project).

The contract (docs/own-project.md): the target returns an `nn.Module` whose `forward(input_ids)` takes a (B, T)
LongTensor and returns (B, T, vocab_size) logits, or an object with `.logits`. The engine builds it on the meta
device, shards it per block, materialises it, then initialises it: the module's `init_weights()` if it has one, else
every submodule's `reset_parameters()` (torch's convention; a buffer that holds values is filled there too: built on
meta, it holds none). The blocks (what is sharded and recomputed) are the class `blocks:` names, else the one class a
Hugging Face model names in `_no_split_modules`, else the class of the repeated children of the module's largest
`nn.ModuleList`.

FLOPs are counted, not assumed: torch's FlopCounterMode runs one forward and backward of a sequence on fake tensors.
Operators that look like compute but that the counter has no formula for are named, so that a model whose
attention the counter cannot see is said to have a low MFU for that reason.

torch and the standard library only (and the user's code); runs in the ranks, the traced predictor and the driver's
check of a point.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from scaling.core.models import HF_TARGET, CustomModel

COMPUTE_OP_WORDS = ("mm", "conv", "attention", "einsum", "matmul", "linear", "bmm", "flash", "efficient")
"""Substrings of an aten operator's name that say it multiplies matrices: one of them that FlopCounterMode has no
formula for is named in the record (its FLOPs are not in the MFU)."""


class ModelError(ValueError):
    """A model the user brings that cannot be used: one line naming the field, the value and what would be valid."""


def project_importable() -> None:
    """Make the working directory importable here and in every process started from here (the ranks, the traced
    predictor's interpreter): the user's project is where the command runs, whatever `sys.path[0]` the entry point
    had (the `scaling` script's is its bin/ directory)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if cwd not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *filter(None, paths)])


def _import(dotted: str, field: str) -> Any:
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise ModelError(f"{field}={dotted!r} is not a dotted path: give module.attribute, e.g. my_pkg.models.GPT")
    if module_name.partition(".")[0] != __name__.partition(".")[0]:
        # A module of the user's project; scaling's own (the Hugging Face builder) is importable wherever scaling is,
        # and the environment is left as it was (PYTHONPATH is part of what warm ranks share: scaling.launch.warm).
        project_importable()
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module may raise anything on import
        raise ModelError(
            f"{field}={dotted!r} does not import: {type(e).__name__}: {e} (the working directory and PYTHONPATH are "
            "searched)"
        ) from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ModelError(f"{field}={dotted!r}: module {module_name!r} has no attribute {attr!r}") from None


def build(model: CustomModel, device: torch.device | str) -> nn.Module:
    """The user's module with its parameters on `device` ("meta": shapes only)."""
    factory: Callable[..., Any] = _import(str(model.target), "model._target_")
    try:
        with torch.device(device):
            built = factory(**model.kwargs)
    except Exception as e:
        raise ModelError(f"model._target_={model.target!r} raised {type(e).__name__}: {e}".splitlines()[0]) from e
    if not isinstance(built, nn.Module):
        raise ModelError(f"model._target_={model.target!r} returned {type(built).__name__}, not an nn.Module")
    return built


def load_code(model: CustomModel) -> None:
    """Import the model's code without building it: the target's module and, for a Hugging Face config, the modeling
    module of its type. A rank calls this before its memory baseline (as `parallel.load_wrappers`), so that what an
    import keeps resident (transformers: tens of MB) is not counted as building the model."""
    _import(str(model.target), "model._target_")
    if model.target == HF_TARGET:
        from scaling.engine.hf_model import load_modeling

        load_modeling(**model.kwargs)


def block_class(model: CustomModel, module: nn.Module) -> type:
    """The class of the blocks to shard and recompute (see the module docstring)."""
    if model.blocks is not None:
        kind = _import(model.blocks, "model.blocks")
        if not (isinstance(kind, type) and issubclass(kind, nn.Module)):
            raise ModelError(f"model.blocks={model.blocks!r} is not an nn.Module class")
        return kind
    named = set(getattr(module, "_no_split_modules", None) or ())  # a Hugging Face model names its blocks
    kinds = {type(m) for m in module.modules() if type(m).__name__ in named}
    if len(kinds) == 1:
        return kinds.pop()
    lists = [m for m in module.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if lists:
        largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
        kinds = {type(child) for child in largest}
        if len(kinds) == 1:
            return kinds.pop()
    raise ModelError(
        f"model {model.name!r} ({model.source}): no blocks found (no nn.ModuleList of one class): name the block class "
        "with model.blocks=my_pkg.models.Block"
    )


def blocks(model: CustomModel, module: nn.Module) -> list[nn.Module]:
    """Every block of the module, in order."""
    kind = block_class(model, module)
    found = [m for m in module.modules() if isinstance(m, kind)]
    if not found:
        raise ModelError(f"model.blocks={model.blocks!r}: the model has no submodule of that class")
    return found


def logits_of(out: Any) -> torch.Tensor:
    """The logits of a forward: the tensor itself, or an output object's `.logits` (as Hugging Face models return)."""
    return out if isinstance(out, torch.Tensor) else out.logits


def wrap_recompute(module: nn.Module, kind: type) -> list[nn.Module]:
    """Checkpoint every block's activations: torch's non-reentrant checkpoint wrapper put in each block's place;
    returns the wrappers (what is then compiled and sharded, as torchtitan does)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    wrappers = []
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, kind):
                wrapper = checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
                parent.register_module(name, wrapper)
                wrappers.append(wrapper)
    return wrappers


@contextlib.contextmanager
def _full_parameters(module: nn.Module, recurse: bool) -> Iterator[list[tuple[nn.Module, str, Any, torch.Tensor]]]:
    """While inside, each parameter of `module` that is a DTensor shard is a whole tensor on its device; on the way
    out each rank copies its shard of the whole one into its own. Plain parameters are left in place."""
    swapped = []
    owners = module.modules() if recurse else [module]
    for owner in owners:
        for name, param in list(owner._parameters.items()):
            if param is not None and hasattr(param, "device_mesh"):
                full = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=param.to_local().device))
                owner._parameters[name] = full
                swapped.append((owner, name, param, full))
    try:
        yield swapped
    finally:
        if swapped:
            from torch.distributed.tensor import distribute_tensor

        for owner, name, param, full in swapped:
            owner._parameters[name] = param
            shard = distribute_tensor(full.detach(), param.device_mesh, param.placements, src_data_rank=None)
            with torch.no_grad():
                param.to_local().copy_(shard.to_local())


@torch.no_grad()
def initialise(module: nn.Module, seed: int) -> None:
    """Seeded init, the same weights for every dp and ZeRO stage: `init_weights()` if the module has one (every
    parameter whole while it runs), else each submodule's `reset_parameters()` in module order (one submodule's
    parameters whole at a time). Every rank draws the same values from torch's seeded generator and keeps its part."""
    torch.manual_seed(seed)
    init = getattr(module, "init_weights", None)
    if callable(init):
        with _full_parameters(module, recurse=True):
            takes_seed = "seed" in inspect.signature(init).parameters
            init(seed) if takes_seed else init()
    else:
        for sub in module.modules():
            if callable(getattr(sub, "reset_parameters", None)):
                with _full_parameters(sub, recurse=False):
                    sub.reset_parameters()


@dataclass(frozen=True)
class Counted:
    """What one forward and backward of a sequence on fake tensors says about a model."""

    n_params: int
    """Distinct parameters."""
    flops_per_token: float
    """Model FLOPs (forward and backward, counted) per token of a sequence of this length."""
    forward_flops_per_token: float
    """The forward's share (a recomputed block runs it twice: hardware FLOPs)."""
    uncounted_ops: tuple[str, ...]
    """Operators that look like matmuls but that the counter has no formula for (their FLOPs are missing)."""
    block: str
    """The block class's name."""
    n_blocks: int
    tensors: tuple[tuple[str, bool, int, int], ...]
    """Its parameter tensors in `parameters()` order, each once (a tied weight too): (name, in a block, rows: dim 0,
    the other dims' product), what the step model's collectives are made of (the built-in family's `param_shapes_of`)."""


class _OpsSeen(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


@functools.lru_cache(maxsize=64)
def _count(model_json: str, seq_len: int) -> Counted:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    model = CustomModel.from_dict(json.loads(model_json))
    # Fake tensors, not meta ones: a model may branch on its inputs' values where it is not being traced, and
    # libraries skip such checks for fake tensors (transformers' masks do). The math kernel of SDPA runs attention as
    # the matmuls the counter has formulas for (the fused CPU kernel has none): the PaLM convention, as the closed form.
    with FakeTensorMode(), sdpa_kernel(SDPBackend.MATH):
        module = build(model, "cpu")
        found = blocks(model, module)
        vocab = model.vocab_size
        ids = torch.zeros((1, seq_len), dtype=torch.long)
        seen = _OpsSeen()
        with FlopCounterMode(display=False) as counter, seen:
            try:
                out = logits_of(module(ids))
            except Exception as e:
                raise ModelError(
                    f"model {model.name!r} ({model.source}): forward(input_ids) on a (1, {seq_len}) LongTensor raised "
                    f"{type(e).__name__}: {e}".splitlines()[0]
                ) from e
            if tuple(out.shape) != (1, seq_len, vocab):
                raise ModelError(
                    f"model {model.name!r} ({model.source}): forward(input_ids) of shape (1, {seq_len}) returned "
                    f"{tuple(out.shape)}; logits of shape (B, T, vocab_size) = (1, {seq_len}, {vocab}) are expected"
                )
            forward = counter.get_total_flops()
            out.float().sum().backward()
        total = counter.get_total_flops()
        n_params = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
        tensors = _param_shapes(module, found)
    known = {getattr(op, "overloadpacket", op) for op in flop_registry}
    uncounted = sorted(
        str(op)
        for op in seen.ops
        if op not in known and any(word in str(op).split(".")[-1] for word in COMPUTE_OP_WORDS)
    )
    return Counted(
        n_params,
        total / seq_len,
        forward / seq_len,
        tuple(uncounted),
        type(found[0]).__name__,
        len(found),
        tensors,
    )


def _param_shapes(module: nn.Module, found: list[nn.Module]) -> tuple[tuple[str, bool, int, int], ...]:
    """(name, in a block, rows, cols) of each distinct parameter in `parameters()` order: what DDP buckets (in reverse),
    ZeroRedundancyOptimizer assigns whole and FSDP2 shards along dim 0, per block and the rest at the root."""
    in_block = {id(p) for b in found for p in b.parameters()}
    return tuple(
        (name, id(p) in in_block, int(p.shape[0]) if p.dim() else 1, math.prod(p.shape[1:]))
        for name, p in module.named_parameters()
    )


def count(model: CustomModel, seq_len: int) -> Counted:
    """Parameters and FLOPs of a user's model at one sequence length, counted once per process (cached), and the
    checks of the contract on the way: it imports, builds, has blocks and maps (1, T) ids to (1, T, vocab) logits.
    Raises ModelError naming what is wrong."""
    return _count(json.dumps(model.to_dict(), sort_keys=True, default=str), int(seq_len))
