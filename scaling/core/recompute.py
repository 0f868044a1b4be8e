"""Activation recomputation as arithmetic: which blocks `train.recompute_every` checkpoints, what share of full
recomputation's FLOPs a setting runs again, and the refusal of an impossible setting. The standard library only: the
engine, the FLOPs of the record, the step model and the MFU model all read it, so each setting means one thing.

- `none`: nothing checkpointed.
- `selective`: per op (torch's selective checkpoint contexts, scaling.model.checkpoint): the outputs of the matmuls
  and of attention are kept, the ops between them (norms, RoPE, SiLU, products, casts) run again in backward. No
  matmul runs twice, so its recomputed FLOPs in the PaLM convention are 0: its HFU equals its MFU, and what it costs
  is the elementwise work, measured (benchmarks/bench_recompute_cpu.py), not counted.
- `full`: only each checkpointed block's input kept; its forward runs again in backward.
"""

from __future__ import annotations

from typing import Optional

from scaling.core.enums import Recompute


def checkpointed(index: int, every: int) -> bool:
    """Whether block `index` (from 0) is checkpointed under recompute_every=`every`: the k-th, 2k-th, ... block, as
    torchtitan's layer mode counts them (every=1: each block)."""
    return (index + 1) % every == 0


def checkpointed_blocks(n_blocks: int, every: int) -> int:
    """How many of `n_blocks` blocks recompute_every=`every` checkpoints."""
    return n_blocks // every


def recomputed_share(recompute: str, every: int, n_blocks: int) -> float:
    """Share of full recomputation's FLOPs (every block's forward again) that a setting runs again: the checkpointed
    share of the blocks under `full`, 0 under `none` and `selective` (no matmul or attention runs twice)."""
    if recompute not in tuple(Recompute):
        raise ValueError(f"train.recompute={recompute!r} is not valid: choose one of {', '.join(Recompute)}")
    if recompute != Recompute.full or n_blocks < 1:
        return 0.0
    return checkpointed_blocks(n_blocks, every) / n_blocks


def every_error(every: object, n_blocks: Optional[int]) -> Optional[str]:
    """Why train.recompute_every=`every` is impossible for a model of `n_blocks` blocks (None: unknown yet), or
    None when it is possible."""
    valid = f"try recompute_every in {{1, ..., {n_blocks}}}" if n_blocks else "1: every block, k: every k-th block"
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        return f"train.recompute_every={every!r} must be an integer >= 1 ({valid})"
    if n_blocks is not None and every > n_blocks:
        return (
            f"train.recompute_every={every} exceeds the model's {n_blocks} blocks: it would checkpoint none; {valid} "
            "(or train.recompute=none)"
        )
    return None
