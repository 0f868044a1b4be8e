"""One optimizer step of one rank: grad_acc micro-batches of mbs samples, then the optimizer.

The worker times it, the memory tracker measures it, and the traced predictor runs the very same
function on fake tensors. torch and the standard library only.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from scaling.engine.data import GlobalBatch, micro_batch
from scaling.engine.parallel import Parallelized


def train_step(
    wrapped: Parallelized, data: GlobalBatch, step: int, dp_rank: int, mbs: int, grad_acc: int,
    before_micro: Optional[Callable[[], None]] = None,
) -> torch.Tensor:
    """One optimizer step over this rank's grad_acc micro-batches; returns the rank's mean loss (a 0-d tensor)."""
    wrapped.zero_grad()
    step_loss = torch.zeros((), device=wrapped.device)
    for micro in range(grad_acc):
        if before_micro is not None:
            before_micro()
        inputs, targets = micro_batch(data, step, dp_rank, micro, mbs, grad_acc, wrapped.device)  # (mbs, T) each
        with wrapped.micro_step(micro, grad_acc):
            with wrapped.autocast():
                logits = wrapped.model(inputs)  # (mbs, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) / grad_acc
            loss.backward()
        step_loss += loss.detach()
    wrapped.optimizer.step()
    return step_loss
