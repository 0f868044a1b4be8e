"""One optimizer step of one rank: grad_acc micro-batches of mbs samples, then the optimizer.

The worker times it, the memory tracker measures it, and the traced predictor runs the very same
function on fake tensors. torch and the standard library only.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from scaling.engine.data import to_device
from scaling.engine.parallel import Parallelized
from scaling.model.spec import logits_of


def train_step(
    wrapped: Parallelized,
    batches: Sequence[torch.Tensor],
    before_micro: Optional[Callable[..., None]] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One optimizer step over this rank's micro-batches (`data.step_batches`: one per micro-step), gradients
    clipped to train.grad_clip; returns the rank's mean loss and the gradient norm before clipping (0-d
    tensors; the norm is None when clipping is off). With pipeline stages the schedule runs the micro-batches, and
    the loss is the step's on the ranks of the last stage, 0 on the others (scaling.engine.pipeline)."""
    wrapped.zero_grad()
    if wrapped.pipeline is not None:  # the schedule runs the micro-batches through this rank's stages
        inputs, targets = to_device(torch.cat(list(batches)), wrapped.device)  # (grad_acc × mbs, T) each
        with wrapped.autocast():
            step_loss = wrapped.pipeline.step(inputs, targets, before_micro)
        grad_norm = wrapped.clip_grad_norm()
        wrapped.optimizer.step()
        return step_loss, grad_norm
    step_loss = torch.zeros((), device=wrapped.device)
    grad_acc = len(batches)
    for micro, rows in enumerate(batches):
        if before_micro is not None:
            before_micro()
        inputs, targets = to_device(rows, wrapped.device)  # (mbs, T) each
        with wrapped.micro_step(micro, grad_acc):
            with wrapped.autocast():
                out = wrapped.model(inputs)
            logits = logits_of(out)  # (mbs, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) / grad_acc
            loss.backward()
        step_loss += loss.detach()
    grad_norm = wrapped.clip_grad_norm()
    wrapped.optimizer.step()
    return step_loss, grad_norm
