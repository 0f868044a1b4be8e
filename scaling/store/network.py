"""The α-β model of ring collectives on two network tiers, and the three places its figures come from.

A ring collective over n ranks on an S-byte buffer costs `t = steps·α + bytes/β`: all-reduce takes
2(n−1) steps moving 2(n−1)/n·S bytes per rank; reduce-scatter and all-gather take (n−1) steps moving
(n−1)/n·S; a broadcast, pipelined along the ring, n−1 steps moving S. α is the latency of one ring step (s),
β the bandwidth per rank (bytes/s: nccl-tests' bus bandwidth).

Two tiers: within a node (`hardware.devices_per_node` ranks) and between nodes, each with its own α and β.
A collective over more ranks than a node holds runs as one ring through its nodes, each node's ranks in a row:
its bandwidth is that of the slowest tier it crosses (every byte passes a hop between nodes), its latency that
of the path a chunk takes, most of whose hops stay within a node. As NCCL's cost model has it (src/graph/
tuning.cc, the ring's latency), a ring over N nodes pays the inter-node α on passes·(N−1) of its steps
(all-reduce 2(N−1), reduce-scatter, all-gather and the broadcast N−1) and the intra-node α on the rest; on one
node every step is within it.

Where the figures come from, each with its spread as draws (`NetworkEstimate`):
- a profile measured by `scaling collectives` (the `scaling.engine.collectives` worker run through the
  same launchers as a point: torchrun here, srun + torchrun across nodes under SLURM), written into the
  sweep directory as `alpha_beta.json`; its draws bootstrap each sample's timed calls;
- published figures per hardware profile (`conf/network/<hardware>.yaml`, sources cited there), as
  ranges; draws are log-uniform within them;
- the sweep's own DP curve (fitted in `analysis.dp_fit`).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import yaml

from scaling.core.files import read_json, write_json_atomic
from scaling.core.schema import config_dirs

PROFILE_FILE = "alpha_beta.json"
"""The measured profile inside a sweep directory; the report uses it when it is there."""
INTRA, INTER = "intra_node", "inter_node"
TIERS = (INTRA, INTER)
CPU_SIZES = (4 * 2**10, 64 * 2**10, 2**20, 4 * 2**20, 16 * 2**20)
CUDA_SIZES = (*CPU_SIZES, 64 * 2**20, 256 * 2**20)
"""Message sizes the benchmark times by default: far enough apart that α (small) and β (large) both show."""


RING_PASSES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
"""The collectives the scaling.engine.collectives worker times, and the passes of each around the ring: all-reduce
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


@dataclass(frozen=True)
class Network:
    """The α-β figures of both tiers (either may be unknown) and where the node boundary lies."""

    tiers: Mapping[str, AlphaBeta]
    devices_per_node: Optional[int]

    def missing(self, n: int) -> list[str]:
        """The tiers a collective over n ranks needs (its bandwidth's and its steps') that have no figures."""
        if n < 2:
            return []
        steps = latency_steps("all_reduce", n, self.devices_per_node)
        needed = {tier_of(n, self.devices_per_node), *(t for t, k in steps.items() if k)}
        return [t for t in TIERS if t in needed and t not in self.tiers]

    def reaches(self, n: int) -> bool:
        """Whether a collective over n ranks can be predicted."""
        return not self.missing(n)

    def time_s(self, op: str, n: int, size_bytes: float) -> float:
        """Predicted seconds of one collective: each step at its tier's α, the bytes at the slowest tier's β."""
        if not self.reaches(n):
            raise ValueError(f"dp={n}: the network has no figures for its tier ({', '.join(self.missing(n))})")
        _, moved = ring_cost(op, n, size_bytes)
        if n < 2:
            return 0.0
        latency = sum(k * self.tiers[t].alpha_s for t, k in latency_steps(op, n, self.devices_per_node).items() if k)
        return latency + moved / self.tiers[tier_of(n, self.devices_per_node)].beta_bytes_per_s


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


def fit(
    samples: Iterable[Mapping[str, Any]], devices_per_node: Optional[int] = None, intra: Optional[AlphaBeta] = None
) -> AlphaBeta:
    """Least-squares α and β of the slowest tier the samples' rings cross, from samples {op, world_size, size_bytes,
    time_s}, in relative error.

    Each equation is divided by its measured time, so 4 KiB and 64 MiB messages weigh alike and
    α (set by small messages) is found as well as β (set by large ones). Rings that span nodes pay their steps
    within a node at `intra`'s α (fitted on launches within one node), which is taken off their times first.
    """
    rows, times, known = [], [], []
    for s in samples:
        n = int(s["world_size"])
        steps = latency_steps(s["op"], n, devices_per_node)
        _, moved = ring_cost(s["op"], n, float(s["size_bytes"]))
        tier = tier_of(n, devices_per_node)
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


def fit_tiers(samples: Sequence[Mapping[str, Any]], devices_per_node: Optional[int]) -> dict[str, AlphaBeta]:
    """α-β of each tier the samples cover: that within a node from launches of n <= devices_per_node ranks, then that
    between nodes from the larger ones, their steps within a node at the first's α."""
    by_tier: dict[str, list[Mapping[str, Any]]] = {}
    for s in samples:
        by_tier.setdefault(tier_of(int(s["world_size"]), devices_per_node), []).append(s)
    tiers: dict[str, AlphaBeta] = {}
    for tier in TIERS:
        if tier in by_tier:
            tiers[tier] = fit(by_tier[tier], devices_per_node, tiers.get(INTRA))
    return tiers


# --- (b) the profile measured by `scaling collectives` -------------------------------------------
@dataclass(frozen=True)
class Profile:
    """What `scaling collectives` measured: where, on how many ranks per node, each tier's fit and the samples."""

    name: str
    devices_per_node: Optional[int]
    tiers: Mapping[str, AlphaBeta]
    samples: tuple[Mapping[str, Any], ...]
    measured_at: Optional[str] = None


def save_profile(path: str | os.PathLike, profile: Profile) -> Path:
    """Write a profile as JSON (atomically)."""
    path = Path(path)
    write_json_atomic(
        path,
        {
            "name": profile.name,
            "measured_at": profile.measured_at,
            "devices_per_node": profile.devices_per_node,
            "tiers": {
                tier: {
                    "alpha_s": ab.alpha_s,
                    "beta_bytes_per_s": ab.beta_bytes_per_s,
                    "world_sizes": sorted(
                        {
                            int(s["world_size"])
                            for s in profile.samples
                            if tier_of(int(s["world_size"]), profile.devices_per_node) == tier
                        }
                    ),
                }
                for tier, ab in profile.tiers.items()
            },
            "samples": list(profile.samples),
        },
    )
    return path


def load_profile(path: str | os.PathLike) -> Profile:
    """Read a profile written by `save_profile`."""
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("tiers"), dict):
        raise ValueError(
            f"{path}: not a network profile of scaling collectives (no 'tiers'): measure it again "
            f"with `scaling collectives --sweep-dir {Path(path).parent}`"
        )
    tiers = {t: AlphaBeta(float(v["alpha_s"]), float(v["beta_bytes_per_s"])) for t, v in doc["tiers"].items()}
    return Profile(
        str(doc.get("name", "profile")),
        doc.get("devices_per_node"),
        tiers,
        tuple(doc.get("samples", ())),
        doc.get("measured_at"),
    )


def profile_draws(profile: Profile, n_draws: int, rng: np.random.Generator) -> list[dict[str, AlphaBeta]]:
    """Tier fits of bootstrap replicates: each sample's time is the median of its timed calls drawn with replacement."""
    draws = []
    for _ in range(n_draws):
        resampled = [
            {**s, "time_s": statistics.median(rng.choice(s["times_s"], len(s["times_s"])).tolist())}
            if s.get("times_s")
            else s
            for s in profile.samples
        ]
        draws.append(fit_tiers(resampled, profile.devices_per_node))
    return draws


def profile_estimate(
    profile: Profile, devices_per_node: Optional[int], n_draws: int, rng: np.random.Generator
) -> NetworkEstimate:
    """The profile as a source: its fits, bootstrap draws, and what it was measured on."""
    notes = []
    if profile.devices_per_node != devices_per_node:
        notes.append(f"measured with devices_per_node={profile.devices_per_node}, the sweep has {devices_per_node}")
    draws = profile_draws(profile, n_draws, rng) if profile.samples else [dict(profile.tiers)] * n_draws
    return NetworkEstimate(
        "profile",
        f"scaling collectives profile ({profile.name})",
        Network(dict(profile.tiers), devices_per_node),
        tuple(Network(d, devices_per_node) for d in draws),
        tuple(notes),
        max((int(s["world_size"]) for s in profile.samples), default=None),
    )


# --- (c) published figures per hardware profile ---------------------------------------------------
@dataclass(frozen=True)
class PublishedTier:
    """Published figures of one tier as ranges (low, high): per-step latency and bus bandwidth per rank."""

    alpha_s: tuple[float, float]
    beta_bytes_per_s: tuple[float, float]

    def nominal(self) -> AlphaBeta:
        """The geometric middle of both ranges."""
        return AlphaBeta(
            math.sqrt(self.alpha_s[0] * self.alpha_s[1]), math.sqrt(self.beta_bytes_per_s[0] * self.beta_bytes_per_s[1])
        )

    def draw(self, rng: np.random.Generator) -> AlphaBeta:
        """Figures drawn log-uniformly within both ranges."""
        return AlphaBeta(*(float(np.exp(rng.uniform(*np.log(r)))) for r in (self.alpha_s, self.beta_bytes_per_s)))


def _range(path: Path, key: str, value: Any) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: {key}={value!r} must be a range [low, high] of two numbers") from None
    if not 0 < low <= high:
        raise ValueError(f"{path}: {key}={value!r} must be a range [low, high] with 0 < low <= high")
    return low, high


def published(hardware: str, network_dir: Optional[Path] = None) -> Optional[dict[str, PublishedTier]]:
    """The published tiers of a hardware profile (`network/<hardware>.yaml` in `network_dir`, else in the project's
    own conf/ or the shipped configs, first found), None when it has none."""
    dirs = [network_dir] if network_dir is not None else [d / "network" for d in config_dirs()]
    path = next((p for p in (d / f"{hardware}.yaml" for d in dirs) if p.is_file()), None)
    if path is None:
        return None
    doc = yaml.safe_load(path.read_text()) or {}
    unknown = set(doc) - {"name", *TIERS}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}: a network profile holds name, {', '.join(TIERS)}")
    tiers = {}
    for tier in TIERS:
        if doc.get(tier):
            entry = doc[tier]
            tiers[tier] = PublishedTier(
                _range(path, f"{tier}.alpha_s", entry.get("alpha_s")),
                _range(path, f"{tier}.beta_bytes_per_s", entry.get("beta_bytes_per_s")),
            )
    return tiers or None


def published_estimate(
    hardware: str, devices_per_node: Optional[int], n_draws: int, rng: np.random.Generator
) -> Optional[NetworkEstimate]:
    """The published figures of a hardware profile as a source, or None when there are none."""
    tiers = published(hardware)
    if tiers is None:
        return None
    draws = tuple(Network({t: p.draw(rng) for t, p in tiers.items()}, devices_per_node) for _ in range(n_draws))
    return NetworkEstimate(
        "published",
        f"published {hardware} figures (conf/network/{hardware}.yaml)",
        Network({t: p.nominal() for t, p in tiers.items()}, devices_per_node),
        draws,
    )


def with_fallback(primary: NetworkEstimate, fallback: NetworkEstimate) -> NetworkEstimate:
    """`primary`'s figures, with the tiers it lacks taken from `fallback` (and said so in its label)."""
    missing = [t for t in fallback.nominal.tiers if t not in primary.nominal.tiers]
    if not missing:
        return primary

    def merge(a: Network, b: Network) -> Network:
        return Network({**{t: b.tiers[t] for t in missing}, **a.tiers}, a.devices_per_node)

    return NetworkEstimate(
        primary.kind,
        f"{primary.label}; {', '.join(missing)} from {fallback.label}",
        merge(primary.nominal, fallback.nominal),
        tuple(merge(a, b) for a, b in zip(primary.draws, fallback.draws)),
        primary.notes,
        primary.measured_up_to,
    )


def describe(profile: Profile) -> list[str]:
    """One line per tier: α, β and the ranks it was measured on."""
    ranks = sorted({int(s["world_size"]) for s in profile.samples})
    return [
        f"{tier}: α = {ab.alpha_s * 1e6:.1f} µs, β = {ab.beta_bytes_per_s / 1e9:.3g} GB/s (n="
        f"{','.join(str(n) for n in ranks if tier_of(n, profile.devices_per_node) == tier)})"
        for tier, ab in profile.tiers.items()
    ]


def read_profile(sweep_dir: Path) -> tuple[Optional[Profile], Optional[str]]:
    """The sweep directory's measured network profile, or None and why it cannot be used (None: there is none)."""
    path = sweep_dir / PROFILE_FILE
    if not path.exists():
        return None, None
    try:
        return load_profile(path), None
    except (ValueError, KeyError, TypeError) as e:
        return None, str(e)
