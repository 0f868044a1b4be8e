"""Training data: the global batch of optimizer step t is a pure function of (seed, t).

Sample i of step t is drawn from its own seeded stream, so (dp, grad_acc, mbs) only decide which
rank and which micro-step gets which rows: `dp=2, grad_acc=2` and `dp=1, grad_acc=4` train on the
same samples. Tokens are synthetic (uniform over the vocabulary) or windows of a memory-mapped
flat token file. torch and the standard library only: this runs inside the worker.
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

import torch

_FILE_DTYPES = {"uint16": (torch.int16, 2), "int32": (torch.int32, 4)}


def _row_seed(seed: int, step: int, row: int) -> int:
    """A 63-bit seed for one sample of one step, independent of how the batch is split."""
    digest = hashlib.blake2b(f"{seed}:{step}:{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class GlobalBatch:
    """Rows of the global batch of any step: each row is seq_len + 1 tokens (inputs and shifted targets)."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        seed: int,
        source: str = "synthetic",
        path: Optional[str] = None,
        dtype: str = "uint16",
    ):
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed
        self.rows_built = 0
        """Rows made so far: the worker checks that none is made inside its timed window."""
        self.tokens: Optional[torch.Tensor] = None
        self._mask: Optional[int] = None
        if source == "file":
            torch_dtype, itemsize = _FILE_DTYPES[dtype]
            n_tokens = os.path.getsize(path) // itemsize
            if n_tokens <= seq_len + 1:
                raise ValueError(
                    f"train.data.path={path!r} holds {n_tokens} tokens; seq_len + 1 = {seq_len + 1} needed"
                )
            # shared=False maps the file copy-on-write: nothing is read until a window is indexed.
            self.tokens = torch.from_file(path, shared=False, size=n_tokens, dtype=torch_dtype)
            if dtype == "uint16":
                self._mask = 0xFFFF

    def row(self, step: int, row: int) -> torch.Tensor:
        """Sample `row` of step `step`: a LongTensor of seq_len + 1 tokens."""
        self.rows_built += 1
        g = torch.Generator().manual_seed(_row_seed(self.seed, step, row))
        if self.tokens is None:
            return torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=g)
        start = int(torch.randint(0, self.tokens.numel() - self.seq_len - 1, (1,), generator=g))
        window = self.tokens[start : start + self.seq_len + 1].long()
        if self._mask is not None:
            window = window & self._mask  # int16 storage of uint16 tokens
        return window % self.vocab_size

    def rows(self, step: int, first: int, count: int) -> torch.Tensor:
        """Rows first .. first+count-1 of step `step`, shape (count, seq_len + 1)."""
        return torch.stack([self.row(step, first + i) for i in range(count)])


def micro_batch_rows(dp_rank: int, micro_step: int, mbs: int, grad_acc: int) -> int:
    """Index of the first global-batch row of one rank's micro-step (rank-major, then micro-step)."""
    return (dp_rank * grad_acc + micro_step) * mbs


def step_batches(
    data: GlobalBatch, step: int, dp_rank: int, mbs: int, grad_acc: int, pin: bool = False
) -> list[torch.Tensor]:
    """This rank's grad_acc micro-batches of step `step`, each (mbs, seq_len + 1) tokens in host memory, built
    ahead of the step so that no data work is timed; `pin` pages them in for an asynchronous copy to a GPU."""
    rows = [data.rows(step, micro_batch_rows(dp_rank, micro, mbs, grad_acc), mbs) for micro in range(grad_acc)]
    return [r.pin_memory() for r in rows] if pin else rows


def to_device(rows: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one micro-batch, each (mbs, seq_len) int64 on `device` (asynchronous from pinned memory).
    The inputs are contiguous, as a data loader hands them to a model and as its contract is checked
    (scaling.model.custom.count): a model that takes `.view()`s of its ids runs as it was checked."""
    rows = rows.to(device, non_blocking=True)
    return rows[:, :-1].contiguous(), rows[:, 1:]
