"""`scaling collectives`' measurement: the collective benchmark (`scaling.engine.collective_bench`) launched
through the same launchers as a point (torchrun here, srun + torchrun across nodes under SLURM) at each world
size, its timings fitted per tier into a `Profile` (`scaling.perf.network`)."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from scaling.core.batch import nodes_needed
from scaling.core.enums import Status
from scaling.core.files import read_json, write_json_atomic
from scaling.core.schema import ExperimentConfig
from scaling.engine.jobfiles import CONFIG_FILE, ELASTIC_LOGS, TORCHRUN_LOG
from scaling.launch import devices, slurm, torchrun, warm
from scaling.perf.network import fit_tiers
from scaling.perf.network_figures import PROFILE_FILE, Profile, save_profile

BENCH_DIR = "collectives"
"""`<sweep_dir>/collectives/n<ranks>/`: one benchmark launch (config.json, torchrun.log, collectives.json)."""
BENCH_OUTPUT = "collectives.json"
BENCH_MODULE = "scaling.engine.collective_bench"


def world_sizes(dp: int, devices_per_node: Optional[int]) -> list[int]:
    """Ranks of each benchmark launch: powers of two from 2 below dp (whole nodes once past one), then dp itself.

    dp=1 (the config's default) measures 2 ranks: a collective needs two.
    """
    top = max(dp, 2)
    below = [2**k for k in range(1, top.bit_length()) if 2**k < top]
    return [n for n in below if devices_per_node is None or n <= devices_per_node or n % devices_per_node == 0] + [top]


def _launch_one(
    cfg: ExperimentConfig, n: int, launch_dir: Path, argv: list[str], env: Mapping[str, str]
) -> dict[str, Any]:
    """One benchmark launch of n ranks in its job directory, holding its devices as a point does; the worker's JSON."""

    hw, out = cfg.hardware, launch_dir / BENCH_OUTPUT
    with warm.fresh_lease(
        devices.request(cfg.changed(parallel={"dp": n, "tp": 1, "dp_shard": None}), env), cfg.launch.devices
    ) as held:
        outcome = torchrun.launch_torchrun(
            argv,
            launch_dir,
            cfg.launch.timeout_s,
            torchrun.job_env(hw.threads_per_device, held.visible, hw.device == "cuda"),
        )
    doc = read_json(out)
    if outcome.status != Status.OK or doc is None:
        raise RuntimeError(
            f"the benchmark on {n} ranks ended {outcome.status}: {outcome.error or 'no ' + BENCH_OUTPUT}"
            f" (log: {launch_dir / TORCHRUN_LOG})"
        )
    return doc


def plan_launches(
    cfg: ExperimentConfig, sweep_dir: Path, sizes_bytes: Sequence[int], iters: int, env: Mapping[str, str]
) -> dict[int, tuple[Path, list[str]]]:
    """Every launch of a measurement, by world size: its directory and its command line (scaling.launch.slurm's
    placement: torchrun here, or one per node through srun under SLURM). A launch that cannot be placed raises
    ValueError here, before any process starts."""
    hw = cfg.hardware
    dpn = hw.devices_per_node
    if int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        raise ValueError(
            "scaling collectives runs as one process that starts every launch: run it with salloc or "
            "in a batch script, not as one of several srun tasks"
        )
    layout = cfg.parallel.layout
    plan = world_sizes(layout.world_size, dpn)
    if "SLURM_JOB_ID" not in env and plan[-1] > (dpn or plan[-1]):
        nodes = nodes_needed(plan[-1], dpn)
        ranks = layout.ranks() + (" ranks" if layout.model_parallel > 1 else "")
        raise ValueError(
            f"{ranks} with hardware.devices_per_node={dpn} spans {nodes} nodes: run scaling collectives inside a SLURM allocation of them (salloc --nodes={nodes} "
            f"scaling collectives ...) or lower parallel.dp to {max(1, (dpn or 1) // layout.model_parallel)}"
        )
    args = ["--sizes", ",".join(map(str, sizes_bytes)), "--iters", str(iters), "--backend", hw.backend]
    # the largest launch also times the rings a point of this layout runs besides every rank's: the dp ranks of one
    # tensor-parallel rank (tp apart), hybrid sharding's replicas of one shard (dp_shard × tp apart)
    strides = [
        s
        for s in (layout.model_parallel, (layout.dp_shard or 0) * layout.model_parallel)
        if 1 < s < plan[-1] and plan[-1] % s == 0
    ]
    launches = {}
    for n in plan:
        stride = ["--stride", ",".join(map(str, strides))] if strides and n == plan[-1] else []
        launch_dir = sweep_dir / BENCH_DIR / f"n{n}"
        module_args = [*args, *stride, "--out", str(launch_dir / BENCH_OUTPUT)]
        launches[n] = (
            launch_dir,
            slurm.torchrun_here(
                BENCH_MODULE,
                module_args,
                n,
                dpn,
                env,
                f"collectives-n{n}",
                cfg.launch.master_port,
                launch_dir / ELASTIC_LOGS,
            ),
        )
    return launches


def measure(
    cfg: ExperimentConfig, sweep_dir: Path, sizes_bytes: Sequence[int], iters: int, env: Mapping[str, str]
) -> Profile:
    """Benchmark the collectives at every world size up to parallel.dp × parallel.tp and fit each tier (`plan_launches` first, so
    a launch that cannot be placed fails before any process starts)."""
    hw = cfg.hardware
    dpn = hw.devices_per_node
    launches = plan_launches(cfg, sweep_dir, sizes_bytes, iters, env)
    runs = []
    for n, (launch_dir, argv) in launches.items():
        for stale in (BENCH_OUTPUT, TORCHRUN_LOG):
            (launch_dir / stale).unlink(missing_ok=True)
        write_json_atomic(launch_dir / CONFIG_FILE, {"hardware": asdict(hw), "world_size": n, "argv": argv})
        runs.append(_launch_one(cfg, n, launch_dir, argv, env))
    samples = tuple(r for run in runs for r in run["results"])
    name = f"{runs[0]['backend']} on {runs[0]['device']} at {runs[0]['hostname']}, n={','.join(map(str, launches))}"
    try:
        tiers = fit_tiers(samples, dpn)
    except ValueError as e:  # measured, but not fittable: not a bad request
        raise RuntimeError(f"the timings in {sweep_dir / BENCH_DIR} cannot be fitted: {e}") from e
    return Profile(name, dpn, tiers, samples, dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))


def keep_earlier(path: Path) -> Optional[Path]:
    """Move an existing profile aside (`alpha_beta.<measured_at>.json`) so a new one never overwrites it."""
    if not path.exists():
        return None
    stamp = (read_json(path) or {}).get("measured_at") or dt.datetime.fromtimestamp(path.stat().st_mtime).isoformat()
    kept = path.with_name(f"{path.stem}.{str(stamp).replace(':', '-')}{path.suffix}")
    os.replace(path, kept)
    return kept


def measure_and_save(
    cfg: Mapping[str, Any], sweep_dir: Path, sizes_bytes: Sequence[int], iters: int = 10
) -> tuple[Profile, Path, Optional[Path]]:
    """`measure` under this process's environment, then the profile saved as the sweep's `alpha_beta.json`, an earlier
    one kept beside it: (profile, its path, the earlier one's new path or None)."""
    profile = measure(cfg, sweep_dir, sizes_bytes, iters, os.environ)
    kept = keep_earlier(sweep_dir / PROFILE_FILE)
    return profile, save_profile(sweep_dir / PROFILE_FILE, profile), kept
