"""A fixed cost per call besides α-β: each collective and each tensor-parallel region pays host time of its own.

    step_s = step_time_s(...) + collective_s · (sharded modules' calls) + plain_call_s · (other data-parallel calls)
             + tp_region_s · (tensor-parallel regions)

α (scaling.perf.network) is a ring step's latency as the collectives benchmark times a collective alone. A sharded
module's call (FSDP's gather or reduce-scatter of a module, hybrid's shard all-reduce) also copies each of the
module's parameters in and out of one flat buffer: `collective_s`. A plain call on one tensor (a DDP bucket, ZeRO-1's
broadcast of a parameter, clipping's norm) is what that benchmark times: `plain_call_s`, 0 unless fitted. A
tensor-parallel region (a split op's dispatch and the collective that closes it): `tp_region_s`. Each is fitted where
measurements identify it (`fit_tp_region_s`, `fit_collective_s`), else drawn from `PRIOR`. Why:
docs/dp-extrapolation.md. Arithmetic on numpy and the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from scaling.perf.network import Network, ring_cost
from scaling.perf.step_model import (
    BLOCK_PARAMS,
    MODULE_GRADS,
    MODULE_PARAMS,
    SHARD_GRADS,
    TP,
    Workload,
    step_collectives,
    step_time_s,
)

MODULE_CALLS = frozenset({MODULE_PARAMS, BLOCK_PARAMS, MODULE_GRADS, SHARD_GRADS})
"""What a sharded module's calls move (the calls `collective_s` is charged on)."""


@dataclass(frozen=True)
class CallCost:
    """Seconds each call pays besides its ring steps' α and its bytes' β."""

    collective_s: float = 0.0
    """A sharded module's collective call (FSDP's gather or reduce-scatter of a module, hybrid's shard all-reduce)."""
    tp_region_s: float = 0.0
    """A tensor-parallel region of a micro-step: one split op's dispatch and the collective that closes it."""
    plain_call_s: float = 0.0
    """Any other data-parallel call (a bucket's all-reduce, a parameter's broadcast, a norm's all-reduce) beyond
    the α the collectives benchmark measured for such a call."""


PRIOR = {"collective_s": (0.0, 30e-6), "tp_region_s": (0.0, 30e-6), "plain_call_s": (0.0, 0.0)}
"""Uniform ranges drawn where no measurement identifies a term, for a GPU whose host runs ahead of its kernels: a
CUDA launch and NCCL's enqueue cost some 5-10 µs on the host, hidden while the stream is busy and paid when it is
not; 30 µs bounds both with room. A plain call's extra is 0: its dispatch is the α the benchmark timed. An
assumption, not a measurement: on CPU the fitted figures are 100× larger (benchmarks/RESULTS.md, bench_tp_cpu.py)."""


def call_counts(w: Workload, n: int, grad_acc: int) -> tuple[int, int, int]:
    """(sharded modules' calls, other data-parallel calls, tensor-parallel regions) of one optimizer step at dp=n:
    those of `step_collectives` whose ring has two ranks or more."""
    if w.layout_at(n).world_size < 2:
        return 0, 0, 0
    module = plain = tp = 0
    for call in step_collectives(w, n, grad_acc):
        ranks, _ = w.ring(call.group, n, None)
        if ranks < 2:
            continue
        if call.group == TP:
            tp += call.count
        elif call.moves in MODULE_CALLS:
            module += call.count
        else:
            plain += call.count
    return module, plain, tp


def calls_per_step(w: Workload, n: int, grad_acc: int) -> tuple[int, int]:
    """(data-parallel collective calls, tensor-parallel regions) of one optimizer step at dp=n (`call_counts`, the
    data-parallel calls of both kinds together)."""
    module, plain, tp = call_counts(w, n, grad_acc)
    return module + plain, tp


def fixed_s(w: Workload, n: int, grad_acc: int, cost: CallCost) -> float:
    """Seconds of one step's per-call costs at dp=n (exposed: the host pays them on the step's critical path)."""
    module, plain, tp = call_counts(w, n, grad_acc)
    return module * cost.collective_s + plain * cost.plain_call_s + tp * cost.tp_region_s


def step_time_with_calls_s(
    w: Workload,
    net: Network,
    n: int,
    compute_s: float,
    overlap: float,
    optimizer_s_per_param: float,
    grad_acc: int,
    cost: CallCost,
) -> float:
    """`step_time_s` plus the step's per-call costs."""
    return step_time_s(w, net, n, compute_s, overlap, optimizer_s_per_param, grad_acc) + fixed_s(w, n, grad_acc, cost)


def fit_tp_region_s(unaccounted_s: float, w: Workload, n: int, grad_acc: int) -> float:
    """The cost per tensor-parallel region from a step's unaccounted seconds at tp > 1: what the step took beyond the
    step model's compute (from the same micro-step at tp=1), optimizer and α-β communication, over its regions;
    0 when the step took less."""
    _, regions = calls_per_step(w, n, grad_acc)
    if regions == 0:
        raise ValueError(f"fit_tp_region_s: tp={w.tp} at dp={n} has no tensor-parallel region to charge")
    return max(unaccounted_s, 0.0) / regions


def fit_collective_s(samples: Iterable[Mapping[str, Any]]) -> Optional[tuple[float, float, float]]:
    """(collective_s, α, 1/β) fitted together on collectives benchmark samples {op, world_size, size_bytes, time_s},
    in relative error: t = c + steps·α + moved/β. A per-call cost and a ring step's latency tell apart only where the
    samples' ring steps differ at a given size (an all-reduce's two passes against a gather's one, or two ring
    lengths); None when they do not, or when the fit gives a negative term."""
    rows, times = [], []
    for s in samples:
        steps, moved = ring_cost(s["op"], int(s["world_size"]), float(s["size_bytes"]))
        rows.append((1.0, steps, moved))
        times.append(float(s["time_s"]))
    if len(times) < 3:
        return None
    a, t = np.asarray(rows, dtype=float), np.asarray(times, dtype=float)
    x = a / t[:, None]
    norms = np.linalg.norm(x, axis=0)
    if np.linalg.matrix_rank(x / norms, tol=1e-9) < 3:
        return None
    coef, *_ = np.linalg.lstsq(x / norms, np.ones_like(t), rcond=None)
    c, alpha, inv_beta = (float(v) for v in coef / norms)
    if c < 0 or alpha < 0 or inv_beta <= 0:
        return None
    return c, alpha, inv_beta


def draw(
    rng: np.random.Generator,
    collective_s: Optional[float] = None,
    tp_region_s: Optional[float] = None,
    plain_call_s: Optional[float] = None,
) -> CallCost:
    """A draw of the per-call costs: a term given (fitted) keeps its figure, one left None is drawn from PRIOR."""
    given = {"collective_s": collective_s, "tp_region_s": tp_region_s, "plain_call_s": plain_call_s}
    return CallCost(**{k: v if v is not None else float(rng.uniform(*PRIOR[k])) for k, v in given.items()})
