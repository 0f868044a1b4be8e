"""A pipeline stage of a model one brings (or a Hugging Face config's), cut between its blocks without knowing its
forward: the model's own forward runs on each stage, its blocks before the stage passing their hidden states on
(in the blocks' output form, read once on fake tensors), the stage's first block taking what the previous stage
sent, the block after its last ending the forward with what it is handed. The first stage is fed the tokens, the
others zeros of their shape (the model's own code turns them into positions and masks; their embedding is dropped).
What is in no block (embeddings, final norm, head) is held by every stage and trained by the stage whose forward
reaches it. The whole model is built and initialised once on the CPU as one rank would, and each stage's part
copied in: every stage starts from the weights of pp 1. torch and the standard library only.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from scaling.core.model_group import ModelError
from scaling.model.spec import logits_of


class _Cut(Exception):
    """Raised where the stage's last block's output reaches the next block: carries it out of the model's forward."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__("pipeline stage ends here")
        self.hidden = hidden


def _hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    """A block's hidden states: its first positional argument, else its first keyword argument."""
    if args:
        return args[0]
    if kwargs:
        return next(iter(kwargs.values()))
    raise ModelError("a block was called with no argument: its hidden states cannot be cut between stages")


class _Before(nn.Module):
    """A block before the stage: hands its hidden states on in the block's output form (`form`)."""

    def __init__(self, form: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self._form = form

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._form(_hidden_of(args, kwargs))


class _After(nn.Module):
    """The block after the stage: ends the forward with the hidden states it is handed."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise _Cut(_hidden_of(args, kwargs))


def output_form(name: str, model: nn.Module, block: nn.Module) -> Callable[[torch.Tensor], Any]:
    """How a block's output carries its hidden states, read from one forward of `model` (built on fake tensors, under
    the fake mode: libraries take their real tensors' paths there) up to its first block: the tensor itself, or a
    tuple whose first element it is (the rest None: attention weights and caches are not asked for)."""
    seen: list[Any] = []

    def hook(module: nn.Module, args: Any, out: Any) -> None:
        seen.append(out)
        raise _Cut(out if isinstance(out, torch.Tensor) else out[0])

    handle = block.register_forward_hook(hook)
    try:
        with torch.no_grad():
            model(torch.zeros(1, 4, dtype=torch.long))
    except _Cut:
        pass
    except Exception as e:
        raise ModelError(
            f"model {name!r}: its forward does not run on fake tensors ({type(e).__name__}: {e}): pipeline stages cannot read its blocks' "
            "output; use parallel.pp=1"
        ) from e
    finally:
        handle.remove()
    if not seen:
        raise ModelError(
            f"model {name!r}: its forward never calls its first block: pipeline stages cannot be cut; use parallel.pp=1"
        )
    out = seen[0]
    if isinstance(out, torch.Tensor):
        return lambda h: h
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        rest = len(out) - 1
        return lambda h: (h, *([None] * rest))
    raise ModelError(
        f"model {name!r}: its blocks return a {type(out).__name__}: pipeline stages cut models whose blocks return their hidden states "
        "(a tensor, or a tuple that starts with them); use parallel.pp=1"
    )


def _place(model: nn.Module, block: nn.Module) -> tuple[nn.Module, str]:
    """(parent, name) where `model` holds `block`."""
    for parent in model.modules():
        for name, child in parent._modules.items():
            if child is block:
                return parent, name
    raise ModelError("a block is not a submodule of the model")


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Put `new` where `model` holds `old` (a block, in its parent's registry)."""
    parent, name = _place(model, old)
    parent._modules[name] = new


class CutStage(nn.Module):
    """One stage of a model cut between its blocks (see the module docstring): blocks `owned` of `blocks` kept, the
    others replaced by stand-ins; tokens (B, T) in on the first stage, hidden states between stages, logits out of
    the last."""

    def __init__(
        self,
        model: nn.Module,
        blocks: list[nn.Module],
        owned: range,
        first: bool,
        last: bool,
        form: Callable[[torch.Tensor], Any],
    ) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.block_class = type(blocks[0])
        self._received: Optional[torch.Tensor] = None
        for i, block in enumerate(blocks):
            if i < owned.start:
                _replace(model, block, _Before(form))
            elif i == owned.stop:
                _replace(model, block, _After())
            elif i > owned.stop:
                _replace(model, block, _Before(form))  # never reached: the forward ends at the one before
        self.model = model
        self._entry = _place(model, blocks[owned.start])
        self._hooked = first  # the first stage takes the tokens: nothing to hand its first block

    def _take_received(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if self._received is None:
            return args, kwargs
        if args:
            return (self._received, *args[1:]), kwargs
        key = next(iter(kwargs))
        return args, {**kwargs, key: self._received}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x
        if not self._hooked:
            # on the module at the first block's place as it runs now (a recompute wrapper, sharded), before every
            # other hook: a wrapper saves, and FSDP2 casts, what the previous stage sent
            parent, name = self._entry
            parent._modules[name].register_forward_pre_hook(self._take_received, prepend=True, with_kwargs=True)
            self._hooked = True
        if not self.first:
            self._received = x
            tokens = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        try:
            out = self.model(tokens)
        except _Cut as cut:
            return cut.hidden
        finally:
            self._received = None
        return logits_of(out)


def copy_values(real: nn.Module, module: nn.Module, full_parameters: Callable[..., Any]) -> None:
    """Each parameter and buffer of `module` given the value of the one of the same name in `real` (the recompute
    wrappers' `_checkpoint_wrapped_module` dropped from its name: a tensor the wrapped block holds itself, a rotary
    table or a layer scale, sits right under it), each rank keeping its part (`full_parameters`: FSDP2's whole
    parameters while they are written)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_WRAPPED_MODULE

    values = dict(real.named_parameters(remove_duplicate=False))
    values.update(real.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for prefix, owner in module.named_modules():
            prefix = ".".join(part for part in prefix.split(".") if part and part != _CHECKPOINT_WRAPPED_MODULE)
            with full_parameters(owner, recurse=False):
                for name, t in [*owner._parameters.items(), *owner._buffers.items()]:
                    if t is not None:
                        t.copy_(values[f"{prefix}.{name}" if prefix else name])
