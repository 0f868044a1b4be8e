"""The α-β model of ring collectives on two network tiers, and its least-squares fit to timed collectives.

A ring collective over n ranks on an S-byte buffer costs `t = steps·α + bytes/β` (α: latency of one ring step, s;
β: bandwidth per rank, bytes/s, nccl-tests' bus bandwidth). Two tiers: within a node (`hardware.devices_per_node`
ranks) and between nodes; a ring over several nodes runs at the slowest tier's β and pays the inter-node α on the
steps that cross nodes (NCCL's ring latency). Where the figures come from: scaling.perf.network_figures. The
derivation: docs/dp-extrapolation.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

INTRA, INTER = "intra_node", "inter_node"
TIERS = (INTRA, INTER)
CPU_SIZES = (4 * 2**10, 64 * 2**10, 2**20, 4 * 2**20, 16 * 2**20)
CUDA_SIZES = (*CPU_SIZES, 64 * 2**20, 256 * 2**20)
"""Message sizes the benchmark times by default: far enough apart that α (small) and β (large) both show."""


RING_PASSES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
"""The collectives the scaling.engine.collective_bench worker times, and the passes of each around the ring: all-reduce
is a reduce-scatter followed by an all-gather."""
MODEL_OPS = (*RING_PASSES, "broadcast")
"""Collectives the step model costs: those the benchmark measures, and the broadcast (costed from their α and β)."""


def ring_cost(op: str, n: int, size_bytes: float) -> tuple[int, float]:
    """(steps, bytes sent per rank) of a ring collective over n ranks on an S-byte buffer: passes·(n−1) steps and
    passes·(n−1)/n·S bytes.

    A broadcast is taken as NCCL runs it, a pipelined ring: the root cuts its S bytes into chunks that each rank
    receives and passes on to the next, so every link carries S bytes once, and the last rank is n−1 hops from
    the root. With chunks much smaller than S that takes `(n−1)·α + S/β`, the same β as the other collectives:
    nccl-tests' bus bandwidth of a broadcast is its algorithm bandwidth S/t (PERFORMANCE.md, factor 1).
    """
    if op not in MODEL_OPS:
        raise ValueError(f"op={op!r} is not a collective of the model: use one of {', '.join(MODEL_OPS)}")
    if n < 1:
        raise ValueError(f"n={n} ranks: a collective needs n >= 1")
    if op == "broadcast":
        return n - 1, size_bytes if n > 1 else 0.0
    passes = RING_PASSES[op]
    return passes * (n - 1), passes * (n - 1) / n * size_bytes


def tier_of(n: int, devices_per_node: Optional[int]) -> str:
    """The slowest tier a collective over n ranks crosses (its bandwidth's): within a node, or between nodes once n
    exceeds one."""
    return INTRA if devices_per_node is None or n <= devices_per_node else INTER


def latency_steps(op: str, n: int, devices_per_node: Optional[int]) -> dict[str, int]:
    """The ring steps of a collective over n ranks by the tier whose α each pays: over N = ceil(n/devices_per_node)
    nodes, passes·(N−1) steps cross between nodes (a broadcast's path N−1) and the rest stay within one."""
    steps, _ = ring_cost(op, n, 0.0)
    if devices_per_node is None or n <= devices_per_node:
        return {INTRA: steps}
    crossings = RING_PASSES.get(op, 1) * (-(-n // devices_per_node) - 1)
    return {INTRA: steps - crossings, INTER: crossings}


@dataclass(frozen=True)
class AlphaBeta:
    """Latency of one ring step α (s) and bandwidth per rank β (bytes/s) of one tier."""

    alpha_s: float
    beta_bytes_per_s: float


def link_flows(rings_at_once: int, links_per_node: Optional[int]) -> int:
    """Rings one inter-node link carries when `rings_at_once` rings of one call cross a node's boundary at once (a
    call's copies on the node: its tensor-parallel ranks', hybrid sharding's replica rings): spread over the node's
    `links_per_node` links, at least one each; 1 with a link per device (None). The inter-node β is one ring's, as
    the collectives benchmark measures it with one ring over every rank."""
    if links_per_node is None or rings_at_once <= links_per_node:
        return 1
    return -(-rings_at_once // links_per_node)


@dataclass(frozen=True)
class Network:
    """The α-β figures of both tiers (either may be unknown) and where the node boundary lies."""

    tiers: Mapping[str, AlphaBeta]
    devices_per_node: Optional[int]
    op_scale: tuple[tuple[str, float], ...] = ()
    """(op, factor) on the bytes term of an op whose transport moves more than the ring's bytes (`fit_op_scale`;
    gloo's reduce-scatter); an op not listed: 1."""
    links_per_node: Optional[int] = None
    """Inter-node links a node's devices send through (hardware.links_per_node); None: one per device, so rings
    that cross nodes at once never share one (`flows`)."""

    def flows(self, rings_at_once: int) -> int:
        """Rings one of this node's inter-node links carries (`link_flows`)."""
        return link_flows(rings_at_once, self.links_per_node)

    def scale(self, op: str) -> float:
        """The factor on `op`'s bytes term."""
        return next((factor for name, factor in reversed(self.op_scale) if name == op), 1.0)  # the last, as a dict

    def missing(self, n: int) -> list[str]:
        """The tiers a collective over n ranks needs (its bandwidth's and its steps') that have no figures."""
        if n < 2 or all(t in self.tiers for t in TIERS):  # every tier has figures (a band's draws ask at each call)
            return []
        steps = latency_steps("all_reduce", n, self.devices_per_node)
        needed = {tier_of(n, self.devices_per_node), *(t for t, k in steps.items() if k)}
        return [t for t in TIERS if t in needed and t not in self.tiers]

    def on_ring(self, devices_per_node: Optional[int]) -> Network:
        """These figures for a ring with `devices_per_node` of its ranks on each node (a strided ring has fewer)."""
        return self if devices_per_node == self.devices_per_node else replace(self, devices_per_node=devices_per_node)

    def reaches(self, n: int) -> bool:
        """Whether a collective over n ranks can be predicted."""
        return not self.missing(n)

    def time_s(self, op: str, n: int, size_bytes: float, rings_at_once: int = 1) -> float:
        """Predicted seconds of one collective: each step at its tier's α, the bytes at the slowest tier's β (between
        nodes, shared by the rings that cross one link at once: `flows`)."""
        if not self.reaches(n):
            raise ValueError(f"dp={n}: the network has no figures for its tier ({', '.join(self.missing(n))})")
        _, moved = ring_cost(op, n, size_bytes)
        if n < 2:
            return 0.0
        latency = sum(k * self.tiers[t].alpha_s for t, k in latency_steps(op, n, self.devices_per_node).items() if k)
        tier = tier_of(n, self.devices_per_node)
        shared = self.flows(rings_at_once) if tier == INTER else 1
        return latency + shared * self.scale(op) * moved / self.tiers[tier].beta_bytes_per_s


@dataclass(frozen=True)
class NetworkEstimate:
    """A network's figures from one source: the nominal values, draws that spread them, and a label."""

    kind: str
    """`profile` (measured by scaling collectives) or `published`."""
    label: str
    nominal: Network
    draws: tuple[Network, ...]
    notes: tuple[str, ...] = field(default=())
    measured_up_to: Optional[int] = None
    """The largest ring its figures were measured on (a profile's largest world size; None: published figures)."""


def sample_ring(sample: Mapping[str, Any], devices_per_node: Optional[int]) -> tuple[int, Optional[int]]:
    """(ranks, ranks of them on one node) of a timed collective's ring: a ring of ranks `stride` apart (hybrid
    sharding's replicas) has devices_per_node // stride of them on each node."""
    stride = int(sample.get("stride", 1))
    per_node = devices_per_node if stride == 1 or devices_per_node is None else max(1, devices_per_node // stride)
    return int(sample["world_size"]), per_node


def fit(
    samples: Iterable[Mapping[str, Any]],
    devices_per_node: Optional[int] = None,
    intra: Optional[AlphaBeta] = None,
    links_per_node: Optional[int] = None,
) -> AlphaBeta:
    """Least-squares α and β of the slowest tier the samples' rings cross, from samples {op, world_size, size_bytes,
    time_s}, in relative error.

    Each equation is divided by its measured time, so 4 KiB and 64 MiB messages weigh alike and
    α (set by small messages) is found as well as β (set by large ones). Rings that span nodes pay their steps
    within a node at `intra`'s α (fitted on launches within one node), which is taken off their times first.
    A strided ring (`stride` rings timed at once, hybrid sharding's replicas) shares a node's links with the others
    (`link_flows` under `links_per_node`): its bytes count that many times, so β stays one ring's.
    """
    rows, times, known = [], [], []
    for s in samples:
        n, per_node = sample_ring(s, devices_per_node)
        steps = latency_steps(s["op"], n, per_node)
        _, moved = ring_cost(s["op"], n, float(s["size_bytes"]))
        tier = tier_of(n, per_node)
        if tier == INTER:  # a node holds min(stride, devices_per_node) of the rings timed at once
            stride = int(s.get("stride", 1))
            moved *= link_flows(min(stride, devices_per_node or stride), links_per_node)
        within = steps[INTRA] if tier == INTER else 0
        if within and intra is None:
            raise ValueError(
                f"fit: a ring over {n} ranks pays {within} of its steps within a node: fit the intra-node tier "
                f"first, from launches of at most {devices_per_node} ranks"
            )
        if steps[tier]:
            rows.append((steps[tier], moved))
            times.append(float(s["time_s"]))
            known.append(within * intra.alpha_s if intra is not None else 0.0)
    a, t, c = (np.asarray(v, dtype=float) for v in (rows, times, known))
    if len(t) < 2 or np.linalg.matrix_rank(a) < 2:
        raise ValueError(f"fit needs timings of at least two sizes at world_size >= 2; got {len(t)} usable samples")
    if (t <= 0).any():
        raise ValueError("fit: every time_s must be > 0")
    x, y = a / t[:, None], 1 - c / t
    (alpha, inv_beta), *_ = np.linalg.lstsq(x, y, rcond=None)
    if alpha < 0:  # pure-bandwidth fit: latency below what the data can resolve
        alpha, inv_beta = 0.0, float(np.sum(x[:, 1] * y) / np.sum(x[:, 1] ** 2))
    if inv_beta <= 0:
        raise ValueError("fit: time does not grow with message size, β cannot be fitted; measure larger sizes")
    return AlphaBeta(float(alpha), float(1.0 / inv_beta))


def fit_tiers(
    samples: Sequence[Mapping[str, Any]], devices_per_node: Optional[int], links_per_node: Optional[int] = None
) -> dict[str, AlphaBeta]:
    """α-β of each tier the samples cover: that within a node from launches of n <= devices_per_node ranks, then that
    between nodes from the larger ones, their steps within a node at the first's α (`fit`: a strided ring's share
    of a node's links under `links_per_node`)."""
    by_tier: dict[str, list[Mapping[str, Any]]] = {}
    for s in samples:
        by_tier.setdefault(tier_of(*sample_ring(s, devices_per_node)), []).append(s)
    tiers: dict[str, AlphaBeta] = {}
    for tier in TIERS:
        if tier in by_tier:
            tiers[tier] = fit(by_tier[tier], devices_per_node, tiers.get(INTRA), links_per_node)
    return tiers


def fit_op_scale(
    samples: Iterable[Mapping[str, Any]], net: Network, min_bytes: float = 2**20
) -> tuple[tuple[str, float], ...]:
    """Per op, the median over its samples of at least `min_bytes` of (time − its steps' α) over the bytes term of
    `net` (fitted on every op together): 1 where the op moves what a ring moves, more where its transport moves more
    (gloo runs a reduce-scatter as more than a ring's one pass). Ops without such samples are left out (factor 1)."""
    ratios: dict[str, list[float]] = {}
    for s in samples:
        if float(s["size_bytes"]) < min_bytes:
            continue
        n, per_node = sample_ring(s, net.devices_per_node)
        bare = Network(net.tiers, per_node)
        _, moved = ring_cost(s["op"], n, float(s["size_bytes"]))
        if n < 2 or moved <= 0 or not bare.reaches(n):
            continue
        latency = bare.time_s(s["op"], n, 0.0)
        bandwidth = moved / bare.tiers[tier_of(n, per_node)].beta_bytes_per_s
        ratios.setdefault(s["op"], []).append(max(float(s["time_s"]) - latency, 0.0) / bandwidth)
    return tuple(sorted((op, float(np.median(r))) for op, r in ratios.items()))
