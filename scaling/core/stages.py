"""Which decoder blocks each pipeline stage holds: contiguous runs balanced by cost (FLOPs per token), the embedding's
cost with the first stage and the final norm's and head's with the last. The engine builds its stages from it and the
predictors and the step model weigh the same stages (one split, one place). Standard library only.
"""

from __future__ import annotations

from typing import Sequence


def split_blocks(
    block_costs: Sequence[float], stages: int, first_extra: float = 0.0, last_extra: float = 0.0
) -> list[range]:
    """The blocks of each of `stages` stages (each a range of block indices, at least one block per stage), chosen so
    the costliest stage (its blocks, plus `first_extra` on the first and `last_extra` on the last) costs least; ties
    go to the split that gives earlier stages the extra blocks (as torchtitan's even split does).

    >>> split_blocks([1.0] * 8, 2)
    [range(0, 4), range(4, 8)]
    >>> split_blocks([1.0] * 8, 2, last_extra=2.0)
    [range(0, 5), range(5, 8)]
    """
    n = len(block_costs)
    if stages < 1 or stages > n:
        raise ValueError(f"{stages} stages cannot split {n} blocks: at least one block per stage")
    prefix = [0.0]
    for cost in block_costs:
        prefix.append(prefix[-1] + cost)

    def cost(stage: int, lo: int, hi: int) -> float:
        extra = (first_extra if stage == 0 else 0.0) + (last_extra if stage == stages - 1 else 0.0)
        return prefix[hi] - prefix[lo] + extra

    # best[s][i]: the least costliest-stage cost of the first i blocks in s + 1 stages; cut[s][i]: where stage s starts
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages)]
    cut = [[0] * (n + 1) for _ in range(stages)]
    for i in range(1, n + 1):
        best[0][i] = cost(0, 0, i)
    for s in range(1, stages):
        for i in range(s + 1, n + 1):
            for j in range(i - 1, s - 1, -1):  # stage s holds blocks j..i-1; latest start first: earlier stages larger
                value = max(best[s - 1][j], cost(s, j, i))
                if value < best[s][i] - 1e-12 * max(1.0, abs(value)):
                    best[s][i], cut[s][i] = value, j
    bounds = [n]
    for s in range(stages - 1, 0, -1):
        bounds.append(cut[s][bounds[-1]])
    bounds.append(0)
    bounds.reverse()
    return [range(bounds[s], bounds[s + 1]) for s in range(stages)]
