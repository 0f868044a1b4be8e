"""Placing a point's ranks under SLURM: how many nodes, who starts torchrun, and its argv.

One node: `torchrun --standalone`; several nodes from one process of the allocation: `srun ... torchrun --nnodes=N
--rdzv-backend=c10d`; several nodes as one of N srun tasks (hydra-submitit-launcher with `nodes: N`): each task
starts its node's torchrun with the same rendezvous and the lead task (`is_lead_task`) writes the record. The
deciding functions are pure (a Mapping, never os.environ); `point_argv` adds the `scontrol` look-ups. What a point
asks of SLURM and the resolvers of conf/hydra/launcher/slurm.yaml live here too.
"""

from __future__ import annotations

import hashlib
import math
import re
import subprocess
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from scaling.core.batch import nodes_needed
from scaling.core.layout import Layout
from scaling.engine.jobfiles import ELASTIC_LOGS
from scaling.launch.torchrun import WORKER, torchrun_argv

RDZV_PORT_BASE, RDZV_PORT_SPAN = 20000, 10000
TIMEOUT_MARGIN_MIN = 5
"""Minutes a SLURM job gets beyond the point's own timeout, so the point records `timeout` itself."""


@dataclass(frozen=True)
class Placement:
    """Where a point's ranks go: `nodes` x `nproc_per_node` ranks, started through srun or not."""

    nodes: int
    nproc_per_node: int
    via_srun: bool
    """True: this process starts one torchrun per node with srun. False: it starts its own node's torchrun."""


def placement(world_size: int, devices_per_node: Optional[int], env: Mapping[str, str]) -> Placement:
    """Decide how the point's `world_size` ranks are started from this process's SLURM environment."""
    nodes = nodes_needed(world_size, devices_per_node)
    copies = int(env.get("SLURM_STEP_NUM_TASKS", "1"))
    if copies > 1:
        step_nodes = int(env.get("SLURM_STEP_NUM_NODES", "1"))
        if copies != step_nodes or step_nodes != nodes:
            raise ValueError(
                f"a point of {world_size} ranks needs {nodes} node(s) but this process is one of {copies} SLURM tasks on "
                f"{step_nodes} node(s): run one task per node on exactly the nodes the point needs "
                f"(hydra.launcher.nodes={nodes} hydra.launcher.tasks_per_node=1)"
            )
        return Placement(nodes, world_size // nodes, via_srun=False)
    if nodes == 1:
        return Placement(1, world_size, via_srun=False)
    if "SLURM_JOB_ID" not in env:
        raise ValueError(
            f"a point of {world_size} ranks with hardware.devices_per_node={devices_per_node} spans {nodes} nodes: "
            f"run it under SLURM (hydra/launcher=slurm) or use at most {devices_per_node} ranks"
        )
    have = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    if have < nodes:
        raise ValueError(
            f"a point of {world_size} ranks with hardware.devices_per_node={devices_per_node} needs {nodes} nodes but "
            f"SLURM job {env['SLURM_JOB_ID']} has {have}: set hydra.launcher.nodes={nodes}"
        )
    return Placement(nodes, world_size // nodes, via_srun=True)


def rendezvous_port(job_id: str, rdzv_name: str) -> int:
    """A c10d port every node of a point derives alike from its SLURM job id and its rendezvous name (the job
    key; no exchange needed): two points of one allocation (salloc, a batch script) never share a rendezvous."""
    if not str(job_id).isdigit():
        raise ValueError(f"SLURM_JOB_ID={job_id!r} is not a job number")
    digest = int(hashlib.sha256(f"{job_id}:{rdzv_name}".encode()).hexdigest()[:8], 16)
    return RDZV_PORT_BASE + digest % RDZV_PORT_SPAN


def srun_argv(p: Placement, hosts: Sequence[str]) -> list[str]:
    """srun options that start one task (one torchrun) on each of the first `p.nodes` hosts."""
    if len(hosts) < p.nodes:
        raise ValueError(f"a {p.nodes}-node point cannot run on hosts {list(hosts)}")
    return [
        "srun",
        f"--nodes={p.nodes}",
        f"--ntasks={p.nodes}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(hosts[: p.nodes])}",
        # The caller may itself run inside a step that holds these CPUs (srun python -m scaling run).
        "--overlap",
        # One node's torchrun failing ends the others instead of leaving them in the rendezvous.
        "--kill-on-bad-exit=1",
    ]


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand a SLURM node list such as `gpu[01-03,7],cpu-a[1-2]b` into host names (pure; no scontrol)."""
    hosts: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist.strip()):
        parts = re.split(r"\[([^\]]*)\]", item)
        choices: list[list[str]] = []
        for i, part in enumerate(parts):
            choices.append(_expand_ranges(part, nodelist) if i % 2 else [part])
        hosts.extend("".join(combo) for combo in product(*choices))
    if not hosts:
        raise ValueError(f"SLURM node list {nodelist!r} names no host")
    return hosts


def _expand_ranges(spec: str, nodelist: str) -> list[str]:
    out = []
    for rng in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", rng.strip())
        if not m:
            raise ValueError(f"SLURM node list {nodelist!r}: cannot read range {rng!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        out.extend(str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1))
    return out


def hostnames(nodelist: str, env: Optional[Mapping[str, str]] = None) -> list[str]:
    """Host names of a node list, as `scontrol show hostnames` gives them (the pure parser if it cannot run)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            env=env and dict(env),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out or expand_hostlist(nodelist)


def node_address(node: str, env: Optional[Mapping[str, str]] = None) -> str:
    """The address SLURM reaches `node` at (its NodeAddr); the name itself if scontrol cannot tell."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", node, "--oneliner"],
            env=env and dict(env),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return node
    m = re.search(r"\bNodeAddr=(\S+)", out)
    return m.group(1) if m else node


def is_lead_task(env: Mapping[str, str]) -> bool:
    """Whether this process writes the point's record: outside SLURM, or SLURM task 0 of the step."""
    return env.get("SLURM_PROCID", "0") == "0"


def torchrun_here(
    module: str,
    module_args: Sequence[str],
    world_size: int,
    devices_per_node: Optional[int],
    env: Mapping[str, str],
    rdzv_name: str,
    port: Optional[int] = None,
    log_dir: Optional[Path] = None,
) -> list[str]:
    """The command that runs `python -m module` as `world_size` ranks from this process: torchrun on one node, or one
    torchrun per node (through srun, or this task's own) joined by a c10d rendezvous named after the SLURM
    job and `rdzv_name`."""
    p = placement(world_size, devices_per_node, env)
    if p.nodes == 1:
        return torchrun_argv(module, module_args, p.nproc_per_node, log_dir=log_dir)
    job_id = env["SLURM_JOB_ID"]
    nodelist = env["SLURM_JOB_NODELIST"] if p.via_srun else env["SLURM_STEP_NODELIST"]
    hosts = hostnames(nodelist, env)
    endpoint = f"{node_address(hosts[0], env)}:{port or rendezvous_port(job_id, rdzv_name)}"
    run = torchrun_argv(
        module,
        module_args,
        p.nproc_per_node,
        nnodes=p.nodes,
        rendezvous=(endpoint, f"scaling-{job_id}-{rdzv_name}"),
        log_dir=log_dir,
    )
    return [*srun_argv(p, hosts), *run] if p.via_srun else run


def point_argv(
    config_path: Path,
    job_key: str,
    world_size: int,
    devices_per_node: Optional[int],
    env: Mapping[str, str],
    port: Optional[int] = None,
) -> list[str]:
    """The command that runs a point's ranks from this process, its rendezvous named after the point."""
    return torchrun_here(
        WORKER,
        [str(config_path)],
        world_size,
        devices_per_node,
        env,
        job_key,
        port,
        log_dir=config_path.parent / ELASTIC_LOGS,
    )


def slurm_timeout_min(timeout_s: float) -> int:
    """SLURM time limit (minutes) for a point whose own timeout is `timeout_s`: that plus a margin."""
    return math.ceil(float(timeout_s) / 60) + TIMEOUT_MARGIN_MIN


def ranks_per_node(world_size: int, devices_per_node: Optional[int]) -> int:
    """Ranks each node of a point runs: all on one node, devices_per_node on each of several."""
    return world_size // nodes_needed(world_size, devices_per_node)


def slurm_world_size(parallel: Mapping[str, Any]) -> int:
    """The ranks of a point's `parallel` group (dp × tp: scaling.core.layout), for the launcher's interpolations."""
    return Layout.of(parallel).world_size


def slurm_gpus_per_node(device: str, world_size: int, devices_per_node: Optional[int]) -> Optional[int]:
    """GPUs a point asks of each node: one per rank there on CUDA (2 ranks take 2 of 8), none on CPU."""
    return ranks_per_node(world_size, devices_per_node) if device == "cuda" else None


def slurm_cpus_per_task(world_size: int, devices_per_node: Optional[int], threads_per_device: int) -> int:
    """CPUs of each node's task (its torchrun and ranks): threads_per_device for every rank there, so that
    ranks never share a core."""
    return ranks_per_node(world_size, devices_per_node) * int(threads_per_device)


def register_resolvers() -> None:
    """Register the OmegaConf resolvers conf/hydra/launcher/slurm.yaml uses (idempotent)."""
    from omegaconf import OmegaConf

    resolvers = {
        "scaling.slurm_world_size": slurm_world_size,
        "scaling.slurm_nodes": nodes_needed,
        "scaling.slurm_timeout_min": slurm_timeout_min,
        "scaling.slurm_gpus_per_node": slurm_gpus_per_node,
        "scaling.slurm_cpus_per_task": slurm_cpus_per_task,
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
