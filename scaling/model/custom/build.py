"""A model the user brings (scaling.core.model_group.CustomModel: their `nn.Module` by `_target_`, a class or a
factory imported from their project), built, given its blocks and initialised as the engine needs it: on the meta
device, then materialised and initialised by `init_weights()` if it has one, else by its own `__init__` run once
for real on the CPU (scaling.model.custom.init), else each submodule's `reset_parameters()`. Its blocks are the class
`blocks:` names, else the one class a Hugging Face model names in `_no_split_modules`, else the class of the repeated
children of its largest `nn.ModuleList`. The contract and what is lost on meta: docs/own-project.md. torch and the
standard library only (and the user's code).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import os
import sys
from typing import Any, Callable, Iterator

import torch
from torch import nn

from scaling.core.model_group import HF_TARGET, CustomModel, ModelError
from scaling.model.custom.init import INIT_WEIGHTS, OWN_INIT, init_kind

BUILT_IN_TARGETS = {
    HF_TARGET: "scaling.model.hf.causal_lm.causal_lm",
    "scaling.engine.model.decoder": "scaling.model.llama.decoder.decoder",
}
"""The project's own factories under the names records give them (part of their job keys: the paths they first
had) -> where they live now."""


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
    dotted = BUILT_IN_TARGETS.get(dotted, dotted)
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
    except ModelError:  # the project's own factories word their refusals
        raise
    except Exception as e:
        what = f"model.{model.source}" if model.target == HF_TARGET else f"model._target_={model.target!r}"
        raise ModelError(f"{what} raised {type(e).__name__}: {e}".splitlines()[0]) from e
    if not isinstance(built, nn.Module):
        raise ModelError(f"model._target_={model.target!r} returned {type(built).__name__}, not an nn.Module")
    return built


def load_code(model: CustomModel) -> None:
    """Import the model's code without building it: the target's module. A rank calls this before its memory baseline
    (as `parallel.load_wrappers`), so that what an import keeps resident is not counted as building the model."""
    _import(str(model.target), "model._target_")


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
        "with blocks: my_pkg.models.Block in the model file, or +model.blocks=my_pkg.models.Block"
    )


def blocks(model: CustomModel, module: nn.Module) -> list[nn.Module]:
    """Every block of the module, in order."""
    kind = block_class(model, module)
    found = [m for m in module.modules() if isinstance(m, kind)]
    if not found:
        raise ModelError(f"model.blocks={model.blocks!r}: the model has no submodule of that class")
    return found


def wrap_recompute(module: nn.Module, kind: type, recompute: str, every: int) -> list[nn.Module]:
    """Checkpoint every `every`-th block under `recompute` (selective or full): torch's non-reentrant checkpoint
    wrapper (with the selective policy's contexts, scaling.model.checkpoint) put in the place of each block it
    checkpoints; returns the blocks as they now run, wrappers or not, in order (what is then compiled and sharded, as
    torchtitan does)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    from scaling.core.recompute import checkpointed
    from scaling.model.checkpoint import checkpoint_kwargs

    kwargs = {k: v for k, v in checkpoint_kwargs(recompute).items() if k != "use_reentrant"}
    found = []
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, kind):
                if checkpointed(len(found), every):
                    child = checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs)
                    parent.register_module(name, child)
                found.append(child)
    return found


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
                if full.is_floating_point():  # NaN where init writes nothing, as scaling.model.custom.init.materialise
                    full.data.fill_(math.nan)
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
def initialise(model: CustomModel, module: nn.Module, seed: int) -> None:
    """Seeded init, the same weights for every dp and ZeRO stage, of the kind `init_kind` chooses: `init_weights()`
    (every parameter whole while it runs); the model's own `__init__`, run once more for real on the CPU and copied
    in (`_own_init`); or each submodule's `reset_parameters()` in module order (one submodule's parameters whole at a
    time). Every rank draws the same values from torch's seeded generator and keeps its part."""
    torch.manual_seed(seed)
    kind = init_kind(module)
    if kind == INIT_WEIGHTS:
        init = module.init_weights
        with _full_parameters(module, recurse=True):
            takes_seed = "seed" in inspect.signature(init).parameters
            init(seed) if takes_seed else init()
    elif kind == OWN_INIT:
        _own_init(model, module, seed)
    else:
        for sub in module.modules():
            if callable(getattr(sub, "reset_parameters", None)):
                with _full_parameters(sub, recurse=False):
                    sub.reset_parameters()


def _own_init(model: CustomModel, module: nn.Module, seed: int) -> None:
    """What the model's `__init__` writes (an `self.apply(self._init_weights)`, the `torch.ones` of a norm of its own:
    all lost on meta): the model built once for real on this rank's CPU from the seed, and each of its parameters and
    buffers copied into the materialised one of the same name (a checkpoint wrapper's prefix dropped), each rank
    keeping its part."""
    from scaling.model.custom.stage import copy_values

    torch.manual_seed(seed)
    copy_values(build(model, "cpu"), module, _full_parameters)


def no_tp_plan(model: CustomModel) -> ModelError:
    """The refusal of tensor parallelism for a model that has no plan, naming the fix."""
    return ModelError(
        f"model {model.name!r} ({model.source}) has no tensor-parallel plan: give its file a tp_plan mapping "
        "module-name patterns to colwise or rowwise (docs/own-project.md)"
    )
