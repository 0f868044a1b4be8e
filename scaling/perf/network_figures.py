"""Where a network's α-β figures come from, each with its spread as draws (a `NetworkEstimate`): (b) a profile
measured by `scaling collectives` through a point's own launchers, kept in the sweep directory as `alpha_beta.json`
(its draws bootstrap each sample's timed calls); (c) published figures per hardware profile
(`conf/network/<hardware>.yaml`, sources cited there, drawn log-uniformly within their ranges). (a), the sweep's
own DP curve, is fitted by scaling.perf.dp_fit. `sources` picks those a sweep's extrapolation uses.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import yaml

from scaling.core.files import config_dirs, read_json, write_json_atomic
from scaling.perf.network import TIERS, AlphaBeta, Network, NetworkEstimate, fit_tiers, tier_of

PROFILE_FILE = "alpha_beta.json"
"""The measured profile inside a sweep directory; the report uses it when it is there."""
N_DRAWS = 200
"""Draws of each source (the extrapolation's bootstrap draws)."""


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


def profile_draws(
    profile: Profile, n_draws: int, rng: np.random.Generator, links_per_node: Optional[int] = None
) -> list[dict[str, AlphaBeta]]:
    """Tier fits of bootstrap replicates: each sample's time is the median of its timed calls drawn with replacement
    (`links_per_node`: scaling.perf.network.fit)."""
    draws = []
    for _ in range(n_draws):
        resampled = [
            {**s, "time_s": statistics.median(rng.choice(s["times_s"], len(s["times_s"])).tolist())}
            if s.get("times_s")
            else s
            for s in profile.samples
        ]
        draws.append(fit_tiers(resampled, profile.devices_per_node, links_per_node))
    return draws


def profile_estimate(
    profile: Profile,
    devices_per_node: Optional[int],
    n_draws: int,
    rng: np.random.Generator,
    links_per_node: Optional[int] = None,
) -> NetworkEstimate:
    """The profile as a source: its fits, bootstrap draws, and what it was measured on (`links_per_node`: the
    hardware's, Network.links_per_node)."""
    notes = []
    if profile.devices_per_node != devices_per_node:
        notes.append(f"measured with devices_per_node={profile.devices_per_node}, the sweep has {devices_per_node}")
    draws = profile_draws(profile, n_draws, rng, links_per_node) if profile.samples else [dict(profile.tiers)] * n_draws
    tiers = (
        fit_tiers(profile.samples, profile.devices_per_node, links_per_node)
        if links_per_node is not None and profile.samples
        else dict(profile.tiers)
    )  # a strided ring measured sharing a link: β as one ring's
    return NetworkEstimate(
        "profile",
        f"scaling collectives profile ({profile.name})",
        Network(tiers, devices_per_node, links_per_node=links_per_node),
        tuple(Network(d, devices_per_node, links_per_node=links_per_node) for d in draws),
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
    hardware: str,
    devices_per_node: Optional[int],
    n_draws: int,
    rng: np.random.Generator,
    network_dir: Optional[Path] = None,
    links_per_node: Optional[int] = None,
) -> Optional[NetworkEstimate]:
    """The published figures of a hardware profile (`published`) as a source, or None when there are none."""
    tiers = published(hardware, network_dir)
    if tiers is None:
        return None
    draws = tuple(
        Network({t: p.draw(rng) for t, p in tiers.items()}, devices_per_node, links_per_node=links_per_node)
        for _ in range(n_draws)
    )
    return NetworkEstimate(
        "published",
        f"published {hardware} figures (conf/network/{hardware}.yaml)",
        Network({t: p.nominal() for t, p in tiers.items()}, devices_per_node, links_per_node=links_per_node),
        draws,
    )


def with_fallback(primary: NetworkEstimate, fallback: NetworkEstimate) -> NetworkEstimate:
    """`primary`'s figures, with the tiers it lacks taken from `fallback` (and said so in its label)."""
    missing = [t for t in fallback.nominal.tiers if t not in primary.nominal.tiers]
    if not missing:
        return primary

    def merge(a: Network, b: Network) -> Network:
        return replace(a, tiers={**{t: b.tiers[t] for t in missing}, **a.tiers})

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


def sources(
    sweep_dir: Path,
    hardware: str,
    dpn: Optional[int],
    n_draws: int = N_DRAWS,
    seed: int = 0,
    links_per_node: Optional[int] = None,
) -> tuple[list[Optional[NetworkEstimate]], list[str]]:
    """`network_sources` of the profile the sweep directory holds now (`alpha_beta.json`, or none)."""
    profile, problem = read_profile(sweep_dir)
    return network_sources(profile, problem, sweep_dir, hardware, dpn, n_draws, seed, links_per_node)


def network_sources(
    profile: Optional[Profile],
    problem: Optional[str],
    sweep_dir: Path,
    hardware: str,
    dpn: Optional[int],
    n_draws: int = N_DRAWS,
    seed: int = 0,
    links_per_node: Optional[int] = None,
) -> tuple[list[Optional[NetworkEstimate]], list[str]]:
    """The sources for a sweep's hardware: (a) always (None), (b) when the sweep has a profile (the tiers it lacks
    from (c)), (c) when the hardware profile has published figures; and notes on what could not be used.
    `links_per_node`: the hardware's inter-node links per node (Network.links_per_node)."""
    rng = np.random.default_rng(seed)
    found: list[Optional[NetworkEstimate]] = [None]
    notes = []
    pub = published_estimate(hardware, dpn, n_draws, rng, links_per_node=links_per_node)
    if problem is not None:
        notes.append(f"The measured profile could not be used: {problem}.")
    elif profile is None:
        notes.append(f"No measured profile: `scaling collectives --sweep-dir {sweep_dir}` writes one ({PROFILE_FILE}).")
    else:
        try:
            prof = profile_estimate(profile, dpn, n_draws, rng, links_per_node)
            found.append(with_fallback(prof, pub) if pub else prof)
        except (ValueError, KeyError, TypeError) as e:
            notes.append(f"The measured profile could not be used: {e}.")
    if pub:
        found.append(pub)
    else:
        notes.append(f"hardware={hardware} has no published network figures (conf/network/{hardware}.yaml).")
    return found, notes
