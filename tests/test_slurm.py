"""SLURM: the placement rules and argv (pure), the launcher config, and real jobs on the test cluster."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis.collect import collect, from_wandb_offline
from scaling.core.batch import nodes_needed
from scaling.launch import slurm
from scaling.launch.torchrun import torchrun_argv

REPO = Path(__file__).resolve().parents[1]
# torchrun: torch.distributed.run's main (scaling/engine/agent.py)
TORCHRUN = [sys.executable, "-m", "scaling.engine.agent"]


# --- placement and argv (pure) -----------------------------------------------------------------
@pytest.mark.parametrize(
    "dp, per_node, nodes", [(1, None, 1), (6, None, 1), (4, 8, 1), (8, 8, 1), (16, 8, 2), (32, 8, 4)]
)
def test_nodes_needed(dp, per_node, nodes):
    assert nodes_needed(dp, per_node) == nodes


def test_nodes_needed_rejects_partial_nodes_naming_the_fields():
    with pytest.raises(ValueError, match=r"parallel.dp=12 .*hardware.devices_per_node=8.*\{8, 16\}"):
        nodes_needed(12, 8)
    with pytest.raises(ValueError, match="parallel.dp=0"):
        nodes_needed(0, None)


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("vm", ["vm"]),
        ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
        ("gpu[08-10],cpu1", ["gpu08", "gpu09", "gpu10", "cpu1"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a-[1-2]-x,b", ["a-1-x", "a-2-x", "b"]),
    ],
)
def test_expand_hostlist(nodelist, hosts):
    assert slurm.expand_hostlist(nodelist) == hosts


def test_expand_hostlist_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="cannot read range 'a-b'"):
        slurm.expand_hostlist("n[a-b]")


def test_single_node_is_standalone_inside_or_outside_slurm():
    config = Path("/runs/demo/abc/config.json")
    expected = [
        *TORCHRUN,
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=4",
        "--log-dir",
        "/runs/demo/abc/elastic",
        "-m",
        "scaling.engine.worker",
        str(config),
    ]
    assert slurm.point_argv(config, "abc", 4, None, {}) == expected
    in_job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "vm", "SLURM_PROCID": "0"}
    assert slurm.point_argv(config, "abc", 4, 8, in_job) == expected


def test_one_process_in_a_multi_node_job_wraps_torchrun_in_srun():
    env = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "gpu[01-03]"}
    p = slurm.placement(16, 8, env)
    assert p == slurm.Placement(nodes=2, nproc_per_node=8, via_srun=True)
    assert slurm.srun_argv(p, ["gpu01", "gpu02", "gpu03"]) == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=gpu01,gpu02",
        "--overlap",
        "--kill-on-bad-exit=1",
    ]
    assert torchrun_argv(
        "scaling.engine.worker", ["c.json"], 8, nnodes=2, rendezvous=("10.0.0.1:29400", "scaling-1234-abc")
    ) == [
        *TORCHRUN,
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=scaling-1234-abc",
        "-m",
        "scaling.engine.worker",
        "c.json",
    ]


def test_one_task_per_node_starts_its_own_torchrun():
    env = {
        "SLURM_JOB_ID": "99",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_PROCID": "1",
    }
    assert slurm.placement(4, 2, env) == slurm.Placement(nodes=2, nproc_per_node=2, via_srun=False)
    assert not slurm.is_lead_task(env)
    assert slurm.is_lead_task({**env, "SLURM_PROCID": "0"}) and slurm.is_lead_task({})


@pytest.mark.parametrize(
    "dp, per_node, env, match",
    [
        (16, 8, {}, r"spans 2 nodes: run it under SLURM"),
        (
            16,
            8,
            {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "1"},
            r"needs 2 nodes but SLURM job 5 has 1: set hydra.launcher.nodes=2",
        ),
        (
            8,
            8,
            {"SLURM_JOB_ID": "5", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2"},
            r"one of 2 SLURM tasks.*hydra.launcher.nodes=1",
        ),
        (
            32,
            8,
            {"SLURM_JOB_ID": "5", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2"},
            r"needs 4 node\(s\).*hydra.launcher.nodes=4",
        ),
    ],
)
def test_placement_errors_say_what_to_set(dp, per_node, env, match):
    with pytest.raises(ValueError, match=match):
        slurm.placement(dp, per_node, env)


def test_rendezvous_port_is_shared_by_the_nodes_of_a_point_and_differs_between_points():
    assert slurm.rendezvous_port("123", "abc") == slurm.rendezvous_port("123", "abc")
    ports = {slurm.rendezvous_port("123", key) for key in ("abc", "abd", "abe", "abf")}
    assert len(ports) == 4  # several points of one allocation never meet in one rendezvous
    assert all(slurm.RDZV_PORT_BASE <= p < slurm.RDZV_PORT_BASE + slurm.RDZV_PORT_SPAN for p in ports)
    with pytest.raises(ValueError, match="SLURM_JOB_ID='abc'"):
        slurm.rendezvous_port("abc", "abc")


# --- conf/hydra/launcher/slurm.yaml -------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, nodes, gpus, cpus, timeout_min",
    [
        ([], 1, None, 1, 15),
        (["parallel.dp=2", "hardware.threads_per_device=2"], 1, None, 4, 15),
        (["hardware=h100", "parallel.dp=16", "launch.timeout_s=300"], 2, 8, 8 * 8, 10),
        (["hardware=h100", "parallel.dp=4"], 1, 4, 4 * 8, 15),
        (["hardware=h100", "parallel.dp=1"], 1, 1, 8, 15),
        (["hardware=h100", "parallel.dp=2", "parallel.tp=2", "parallel.zero_stage=3"], 1, 4, 4 * 8, 15),
        (["hardware=h100", "parallel.dp=4", "parallel.tp=4", "parallel.zero_stage=3"], 2, 8, 8 * 8, 15),
    ],
)
def test_launcher_config_asks_for_what_the_point_needs(overrides, nodes, gpus, cpus, timeout_min):
    """GPUs: one per rank on the node (not the node's 8); CPUs: threads_per_device for every rank there."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from scaling.launch.resolvers import register_configs

    register_configs()
    slurm.register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            "config", overrides=["hydra/launcher=slurm", "sweep_dir=/s", *overrides], return_hydra_config=True
        )
    HydraConfig.instance().set_config(cfg)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert (launcher["nodes"], launcher["gpus_per_node"], launcher["cpus_per_task"], launcher["timeout_min"]) == (
        nodes,
        gpus,
        cpus,
        timeout_min,
    )
    assert launcher["tasks_per_node"] == 1 and launcher["submitit_folder"] == "/s/.submitit/%j"


# --- real jobs on the test cluster ------------------------------------------------------------
@pytest.mark.slurm
def test_one_node_cluster_runs_a_job_and_stops_without_leftovers(slurm_cluster):
    """A cluster of this host alone: a job runs; stopping it mid-job leaves no process and no state."""
    from tests.helpers.slurm_cluster import SlurmCluster, _pids_of

    cluster = SlurmCluster(nodes=1)
    cluster.start()
    state = cluster.state_dir
    try:
        ran = subprocess.run(
            ["srun", "--nodes=1", "hostname"], env=cluster.env, capture_output=True, text=True, timeout=60
        )
        assert ran.returncode == 0 and ran.stdout.strip() == socket.gethostname(), ran.stderr
        subprocess.run(
            ["sbatch", "--output=/dev/null", "--wrap=sleep 300"],
            env=cluster.env,
            check=True,
            capture_output=True,
            timeout=60,
        )
        assert _wait_for(
            lambda: (
                "R"
                in subprocess.run(
                    ["squeue", "-h", "-o", "%t"], env=cluster.env, capture_output=True, text=True
                ).stdout.split()
            )
        )
        assert _pids_of(state)
    finally:
        cluster.stop()
    assert not state.exists() and _pids_of(state) == []
    # The session's own cluster is untouched.
    assert subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, text=True).stdout.split() == ["up"]


def _wait_for(ready, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(0.2)
    return False


def _executor(cluster, folder: Path, **params):
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition=cluster.partition, **params)
    return executor


@pytest.mark.slurm
def test_submitit_job_runs_on_the_cluster(slurm_cluster, tmp_path):
    import operator

    import submitit

    executor = _executor(slurm_cluster, tmp_path / "submitit")
    product = executor.submit(operator.mul, 6, 7)
    where = executor.submit(submitit.helpers.CommandFunction(["bash", "-c", "echo $SLURM_JOB_ID $SLURMD_NODENAME"]))
    assert product.result() == 42
    job_id, node = where.result().split()
    assert job_id == where.job_id and node in slurm_cluster.nodes


def _assert_allreduce_spanned_two_nodes(out: Path, cluster) -> None:
    result = json.loads(out.read_text())
    assert (result["world_size"], result["sum"]) == (2, 3.0)
    assert sorted(result["nodes"]) == cluster.nodes[:2]


_LAUNCH = (
    "import os, subprocess, sys; from scaling.launch.slurm import torchrun_here; "
    "sys.exit(subprocess.run(torchrun_here('tests.helpers.slurm_allreduce', sys.argv[1:], 2, 1, os.environ, 'allreduce'))"
    ".returncode)"
)


@pytest.mark.slurm
def test_two_nodes_one_task_each_rendezvous_over_c10d(slurm_cluster, tmp_path):
    """hydra-submitit's shape for a 2-node point: a task per node, each starting its node's torchrun."""
    import submitit

    if len(slurm_cluster.nodes) < 2:
        pytest.skip("the test cluster has one node")
    out = tmp_path / "allreduce.json"
    executor = _executor(slurm_cluster, tmp_path / "submitit", nodes=2, tasks_per_node=1)
    job = executor.submit(submitit.helpers.CommandFunction([sys.executable, "-c", _LAUNCH, str(out)], cwd=str(REPO)))
    job.results()
    _assert_allreduce_spanned_two_nodes(out, slurm_cluster)


def _in_two_node_allocation(script: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c script args` as the one process of a 2-node allocation (salloc, as a user's batch script runs)."""
    argv = ["salloc", "--nodes=2", "--ntasks-per-node=1", "--time=5", sys.executable, "-c", script, *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)


@pytest.mark.slurm
def test_one_process_in_a_two_node_allocation_starts_both_nodes_with_srun(slurm_cluster, tmp_path):
    """A single driver in the allocation (salloc, a batch script): srun starts one torchrun per node."""
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("the test cluster has one node")
    out = tmp_path / "allreduce.json"
    done = _in_two_node_allocation(_LAUNCH, str(out))
    assert done.returncode == 0, done.stderr
    _assert_allreduce_spanned_two_nodes(out, slurm_cluster)


_STEPS = """
import json, os, signal, subprocess, sys, time
from pathlib import Path
from scaling.launch.torchrun import end_slurm_step, slurm_steps, step_name
job, here = os.environ["SLURM_JOB_ID"], Path(sys.argv[1])
def start(token):
    task = f"touch {here}/{token}.$SLURM_PROCID && exec sleep 300"
    argv = ["srun", f"--job-name={step_name(token)}", "--nodes=2", "--ntasks=2", "--overlap", "bash", "-c", task]
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
ours, theirs = start("ours"), start("theirs")
deadline = time.monotonic() + 60
while len(list(here.glob("*.[01]"))) < 4:  # every task of both steps running
    assert time.monotonic() < deadline, "the steps never started"
    time.sleep(0.2)
os.killpg(ours.pid, signal.SIGKILL)  # its srun gone without a word to the step's tasks
ours.wait()
start_s = time.monotonic()
end_slurm_step("ours", os.environ)
left = {"ours": slurm_steps(job, step_name("ours")), "theirs": slurm_steps(job, step_name("theirs"))}
left["s"] = time.monotonic() - start_s
os.killpg(theirs.pid, signal.SIGTERM)
theirs.wait()
print(json.dumps(left))
"""


@pytest.mark.slurm
def test_a_launch_through_srun_is_ended_by_its_job_step_and_another_step_is_left_alone(slurm_cluster, tmp_path):
    """A multi-node launch started through srun names its job step after the launch; its end cancels that step on
    every node (its srun may be gone, killed without a word) and waits until it has left the queue, while the
    step of another launch in the same allocation goes on."""
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("the test cluster has one node")
    done = _in_two_node_allocation(_STEPS, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    left = json.loads(done.stdout.strip().splitlines()[-1])
    assert left["ours"] == [] and len(left["theirs"]) == 1 and left["s"] < 60, left


@pytest.mark.slurm
def test_sweep_through_the_slurm_launcher_records_every_point(slurm_cluster, tmp_path):
    """`python -m scaling run -m hydra/launcher=slurm ...`: one SLURM job per point, one record and one
    offline W&B run each, the runs read back equal to the records."""
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "scaling",
            "run",
            "-m",
            "hydra/launcher=slurm",
            "model=tiny",
            "parallel.dp=1,2",
            "parallel.zero_stage=3",
            "train.warmup_steps=0",
            "train.steps=1",
            "logger=wandb",
            "logger.mode=offline",
            f"sweep_dir={sweep_dir}",
            "hydra.launcher.array_parallelism=2",
        ],  # two points at a time on this machine's cores
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "WANDB_SILENT": "true"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/result.json"))]
    assert [r["status"] for r in records] == ["ok"] * 2, [(r["status"], r["error"]) for r in records]
    assert len({r["job_key"] for r in records}) == 2
    grid = sorted((r["config"]["parallel"]["dp"], r["config"]["parallel"]["zero_stage"]) for r in records)
    assert grid == [(1, 3), (2, 3)]
    for r in records:
        m = r["metrics"]
        assert m["tokens_per_s"] > 0 and m["peak_mem_bytes"] > 0 and len(m["losses"]) >= 2
    # Each point ran as a task of a SLURM job array, which left its log in the submitit folder; one array per
    # resource shape, each asking for the CPUs its points' ranks need (one thread per rank: dp CPUs).
    task_logs = sorted(sweep_dir.glob(".submitit/*/*_0_log.out"))
    assert len(task_logs) == 2 and all("Job completed successfully" in p.read_text() for p in task_logs)
    assert stat.S_IMODE((sweep_dir / ".submitit").stat().st_mode) == 0o700  # its pickles: nobody else writes there
    asked = {}
    for script in sweep_dir.glob(".submitit/*/*_submission.sh"):
        (cpus,) = re.findall(r"^#SBATCH --cpus-per-task=(\d+)$", script.read_text(), re.M)
        asked[script.name.split("_")[0]] = int(cpus)
    arrays = {r["provenance"]["slurm_job_id"].split("_")[0]: r["config"]["parallel"]["dp"] for r in records}
    assert len(asked) == 2 and asked == arrays, (asked, arrays)
    # Each job logged its point to W&B from its SLURM task.
    runs = list((sweep_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2
    pd.testing.assert_frame_equal(from_wandb_offline(sweep_dir).drop(columns="wandb_run_id"), collect(sweep_dir))


def test_the_submitit_folder_is_private_whatever_the_umask(tmp_path):
    """The driver and every task load pickles from the submitit folder: it is made 0700 (an existing one of this
    user's is closed), and a symbolic link or another user's folder is refused by name before anything is submitted."""
    from hydra_plugins.scaling_slurm_launcher._impl import private_folder

    old = os.umask(0o002)
    try:
        made = private_folder(str(tmp_path / "sweep" / ".submitit" / "%j"))
    finally:
        os.umask(old)
    assert made == tmp_path / "sweep" / ".submitit" and stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o775)
    assert stat.S_IMODE(private_folder(str(made / "%j")).stat().st_mode) == 0o700
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=r"submitit_folder: .*linked is not a directory of its own"):
        private_folder(str(tmp_path / "linked" / "%j"))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)  # as root here; for a user, a folder another user made
    with pytest.raises(ValueError, match=r"belongs to uid 65534, not to this user"):
        private_folder(str(theirs / "%j"))
