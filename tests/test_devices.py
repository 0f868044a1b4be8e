"""Device leases: slot choice, real flock leases across processes, and the parallel launcher's real sweeps."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from scaling.core.schema import ExperimentConfig
from scaling.launch.devices import (
    CPU_SLOT,
    LOCK_DIR_ENV,
    LeaseTimeout,
    LockDirError,
    Request,
    checked_lock_dir,
    hold,
    lease,
    lock_dir,
    pick,
    request,
    waiting_s,
)
from scaling.store.read import iter_records
from tests.helpers.compose import compose_point
from tests.helpers.points import ONE_STEP as FAST

# A process that leases `wanted` of `n` slots, stamps when it got them, holds them until the test creates
# <out>.release, stamps the release. Each stamp appears whole (written beside, then renamed): the test reads a
# stamp as soon as its file exists.
HOLDER = textwrap.dedent("""\
    import json, os, sys, time
    from scaling.launch.devices import lease
    out, wanted, n, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    def stamp_to(path, stamp):
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(stamp))
        os.replace(path + ".tmp", path)
    slots = [str(i) for i in range(n)] if kind == "cuda" else ["host"]
    with lease(wanted, slots, kind=kind, poll_s=0.05) as got:
        stamp = {"got": got, "acquired": time.time()}
        stamp_to(out + ".acquired", stamp)
        while not os.path.exists(out + ".release"):
            time.sleep(0.01)
        stamp["released"] = time.time()
    stamp_to(out, stamp)
    """)


@pytest.fixture
def lock_env(tmp_path, monkeypatch) -> dict[str, str]:
    """A private lock directory for this test, in this process and the processes it starts."""
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))
    return {**os.environ, LOCK_DIR_ENV: str(tmp_path / "locks")}


def release(path: Path) -> None:
    """Let the HOLDER writing `path` give its slots back."""
    path.with_name(path.name + ".release").touch()


def start_holder(
    path: Path, wanted: int, n: int, env: dict[str, str], hold: bool = True, kind: str = "cuda"
) -> subprocess.Popen:
    """A HOLDER process (of GPUs, or of the host's one CPU slot); with hold=False it gives its slots back as soon as
    it has them."""
    if not hold:
        release(path)
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(wanted), str(n), kind], env=env)


def wait_for(path: Path, timeout_s: float = 30.0) -> dict:
    deadline = time.time() + timeout_s
    while not path.exists():
        assert time.time() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)
    return json.loads(path.read_text())


def test_pick_prefers_aligned_then_contiguous_blocks():
    assert pick({0, 1, 2, 3}, 2) == [0, 1]
    assert pick({1, 2, 3}, 2) == [2, 3]  # aligned beats the contiguous 1-2
    assert pick({1, 2, 4}, 2) == [1, 2]
    assert pick({0, 2, 5}, 2) == [0, 2]  # no block free: the lowest ids
    assert pick({3}, 1) == [3]
    assert pick({0, 1, 2, 3, 4, 5, 6, 7}, 8) == list(range(8))
    assert pick({0, 2}, 3) is None and pick(set(), 1) is None
    with pytest.raises(ValueError, match="wanted=0"):
        pick({0, 1}, 0)


def test_request_says_what_a_point_leases():
    cfg = ExperimentConfig().changed(hardware={"device": "cuda", "devices_per_node": 4}, parallel={"dp": 2})
    assert request(cfg, {}) == Request("cuda", 2, ("0", "1", "2", "3"))
    assert request(cfg, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == Request("cuda", 2, ("4", "5", "6", "7"))
    # Inside a SLURM allocation the point leases among the GPUs SLURM gave the job.
    assert request(cfg, {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1"}) == Request("cuda", 2, ("0", "1"))
    assert request(cfg.changed(parallel={"dp": 8}), {"SLURM_JOB_ID": "7"}) is None  # its nodes are its own
    assert request(cfg.changed(launch={"devices": "2,3"}), {}) is None  # fixed by hand
    cpu = ExperimentConfig().changed(parallel={"dp": 4})
    assert request(cpu, {}) == Request("cpu", 1, ("host",))  # CPU points take the whole host
    with pytest.raises(ValueError, match=r"parallel.dp=2 needs 2 GPUs .* CUDA_VISIBLE_DEVICES='5' lists 1"):
        request(cfg, {"CUDA_VISIBLE_DEVICES": "5"})


def test_each_slurm_job_has_locks_of_its_own(tmp_path):
    """GPU ids inside a job are the job's own (SLURM renumbers them): two jobs on one node never share a lock."""
    env = {LOCK_DIR_ENV: str(tmp_path)}
    assert lock_dir(env) == tmp_path
    assert lock_dir({**env, "SLURM_JOB_ID": "41"}) == tmp_path / "slurm-41" != lock_dir({**env, "SLURM_JOB_ID": "42"})


# Two points of one interactive allocation (salloc), each leasing 2 of the job's 4 GPUs for a moment.
IN_JOB = textwrap.dedent("""\
    import json, os, sys, time
    from scaling.core.schema import ExperimentConfig
    from scaling.launch.devices import hold, lock_dir, request
    cfg = ExperimentConfig().changed(hardware={"device": "cuda", "devices_per_node": 4}, parallel={"dp": 2})
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    with hold(request(cfg, env), None, poll_s=0.05) as held:
        t = time.time()
        time.sleep(2.0)
    line = json.dumps({"visible": held.visible, "start": t, "end": time.time(), "locks": str(lock_dir())})
    os.write(1, (line + "\\n").encode())  # one write, whole: the two processes share the pipe
    """)


@pytest.mark.slurm
def test_points_inside_one_slurm_allocation_lease_disjoint_gpus(slurm_cluster, tmp_path, lock_env):
    script = tmp_path / "in_job.py"
    script.write_text(IN_JOB)
    both = f"{sys.executable} {script} & {sys.executable} {script} & wait"
    done = subprocess.run(
        ["salloc", "--nodes=1", "--time=5", "bash", "-c", both],
        cwd=Path(__file__).parents[1],
        env=lock_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    a, b = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    overlap = a["start"] < b["end"] and b["start"] < a["end"]
    assert overlap and set(a["visible"].split(",")).isdisjoint(b["visible"].split(","))  # at once, on other GPUs
    assert a["locks"] == b["locks"] and "/slurm-" in a["locks"]


@pytest.mark.subprocess
def test_concurrent_leases_get_disjoint_slots_and_a_third_waits(tmp_path, lock_env):
    a = start_holder(tmp_path / "a", 2, 4, lock_env)
    b = start_holder(tmp_path / "b", 2, 4, lock_env)
    got_a, got_b = wait_for(tmp_path / "a.acquired"), wait_for(tmp_path / "b.acquired")  # both hold theirs now
    c = start_holder(tmp_path / "c", 2, 4, lock_env, hold=False)
    time.sleep(1.0)
    assert not (tmp_path / "c.acquired").exists() and c.poll() is None  # all four slots are held: it waits
    release(tmp_path / "a")
    release(tmp_path / "b")
    for p in (a, b, c):
        assert p.wait(timeout=30) == 0
    done = {k: json.loads((tmp_path / k).read_text()) for k in "abc"}
    assert sorted(got_a["got"] + got_b["got"]) == ["0", "1", "2", "3"]  # disjoint, two aligned pairs
    first_free = min(done["a"]["released"], done["b"]["released"])
    assert done["c"]["acquired"] >= first_free, "the third lease ran while all four slots were held"
    assert done["c"]["got"] in (done["a"]["got"], done["b"]["got"])


@pytest.mark.subprocess
def test_a_killed_holder_releases_its_slots(tmp_path, lock_env):
    holder = start_holder(tmp_path / "h", 4, 4, lock_env)
    wait_for(tmp_path / "h.acquired")
    assert (tmp_path / "locks" / "cuda-0.lock").read_text().split()[0] == str(holder.pid)  # who holds it
    waiter = start_holder(tmp_path / "w", 1, 4, lock_env, hold=False)
    time.sleep(1.0)
    assert not (tmp_path / "w.acquired").exists() and waiter.poll() is None
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    killed_at = time.time()
    assert waiter.wait(timeout=30) == 0
    assert wait_for(tmp_path / "w")["acquired"] - killed_at < 5.0


@pytest.mark.subprocess
def test_a_stopped_holder_is_gone_past_on_cpu_once_stalled_and_its_gpus_are_not(tmp_path, lock_env, capsys):
    """A holder stopped (SIGSTOP) with nothing of it running: past launch.stalled_wait_s its CPU slot is run beside
    (the waiter keeping its place first in line, so the holder, continued, waits behind it), its GPUs are not (their
    memory stays taken): LeaseTimeout."""
    gpus, host = start_holder(tmp_path / "g", 2, 2, lock_env), start_holder(tmp_path / "c", 1, 1, lock_env, kind="cpu")
    wait_for(tmp_path / "g.acquired"), wait_for(tmp_path / "c.acquired")
    for holder in (gpus, host):
        holder.send_signal(signal.SIGSTOP)
    try:
        stopped = r"cuda-\d\.lock held by a stopped process past launch.stalled_wait_s"
        with pytest.raises(LeaseTimeout, match=stopped), lease(1, ["0", "1"], poll_s=0.05, stalled_wait_s=0.5):
            pass
        queue = os.open(tmp_path / "locks" / "cpu.queue.lock", os.O_RDWR)
        with lease(1, [CPU_SLOT], kind="cpu", poll_s=0.05, stalled_wait_s=0.5) as got:
            assert got == [CPU_SLOT]
            with pytest.raises(BlockingIOError):  # first in line while it runs beside the stopped holder
                fcntl.flock(queue, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(queue, fcntl.LOCK_EX | fcntl.LOCK_NB)  # and no more once it is done
        os.close(queue)
    finally:
        for holder in (gpus, host):
            holder.send_signal(signal.SIGCONT)
    err = capsys.readouterr().err
    assert f"going past cpu-host.lock, held by pid {host.pid} (" in err and ", stopped and idle for " in err, err
    for name, holder in (("g", gpus), ("c", host)):
        release(tmp_path / name)
        assert holder.wait(timeout=30) == 0


@pytest.mark.subprocess
def test_a_lease_waits_until_its_deadline_and_names_the_holder(tmp_path, lock_env, capsys):
    holder = start_holder(tmp_path / "h", 2, 2, lock_env)
    wait_for(tmp_path / "h.acquired")
    started = time.monotonic()
    with pytest.raises(LeaseTimeout) as e, lease(1, ["0", "1"], wait_s=1.0, poll_s=0.05):
        pass
    assert 1.0 <= time.monotonic() - started < 5.0
    message = str(e.value)
    assert f"cuda-0.lock held by pid {holder.pid} (" in message and "since 20" in message, message
    assert f"({sys.executable} -c" in message  # its command line
    assert f"pid {holder.pid}" in capsys.readouterr().err  # said once while it waited
    release(tmp_path / "h")
    assert holder.wait(timeout=30) == 0


@pytest.mark.subprocess
def test_a_holder_sees_who_waits_in_the_directory_of_its_lease_whatever_the_environment_says_later(
    tmp_path, lock_env, monkeypatch
):
    """A warm job's idle watch gives the host back when another process waits for it: it looks in the lock directory
    its lease is in, also once this process's environment names another (a test of its own, here)."""
    host = Request("cpu", 1, (CPU_SLOT,))
    waiter_code = "from scaling.launch.devices import CPU_SLOT, lease\nwith lease(1, [CPU_SLOT], kind='cpu', poll_s=0.05):\n    pass"
    with hold(host, None) as held:
        assert held.lock_dir == tmp_path / "locks"
        monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "elsewhere"))
        waiter = subprocess.Popen([sys.executable, "-c", waiter_code], env=lock_env)
        deadline = time.monotonic() + 30
        while waiting_s(host, held.lock_dir) is None:
            assert time.monotonic() < deadline and waiter.poll() is None, "the waiter never queued"
            time.sleep(0.05)
        assert waiting_s(host) is None  # the environment's directory: nobody waits there
    assert waiter.wait(timeout=30) == 0  # it got the host once the lease ended


def test_a_second_lease_of_a_slot_this_process_holds_is_refused_not_waited_for(lock_env):
    refused = pytest.raises(RuntimeError, match=r"already holds cpu-host.lock \(since .*would wait for itself")
    with lease(1, [CPU_SLOT], kind="cpu"), refused, lease(1, [CPU_SLOT], kind="cpu"):
        pass
    with lease(1, [CPU_SLOT], kind="cpu"):  # released: taken again at once
        pass


def run_sweep(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scaling", "run", "-m", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )


@pytest.mark.subprocess
def test_parallel_launcher_runs_jobs_at_once_but_cpu_launches_one_at_a_time(tmp_path, lock_env):
    sweep_dir = tmp_path / "runs"
    out = run_sweep(
        ["hydra/launcher=parallel", "hydra.launcher.n_jobs=2", *FAST, "train.seed=1,2", f"sweep_dir={sweep_dir}"],
        tmp_path,
        lock_env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = list(iter_records(sweep_dir))
    assert sorted(r["status"] for r in records) == ["ok", "ok"]
    first, second = sorted(records, key=lambda r: r["timing"]["launched_at"])

    def window(r: dict) -> tuple[float, float]:
        start = dt.datetime.fromisoformat(r["timing"]["launched_at"]).timestamp()
        return start, start + r["timing"]["torchrun_wall_s"]

    assert window(second)[0] >= window(first)[1], "two CPU points were launched at the same time"
    # Both Hydra jobs were in flight together: the second waited for the host while the first ran.
    assert second["timing"]["device_wait_s"] > 1.0 > first["timing"]["device_wait_s"]
    assert first["env"]["devices"] is None and (tmp_path / "locks" / "cpu-host.lock").exists()
    # The driver prints each job's progress line, numbered across the workers.
    lines = re.findall(r"^\[(\d)/2\] ([0-9a-f]{12}) ok ", out.stdout, re.M)
    assert [n for n, _ in lines] == ["1", "2"] and {k for _, k in lines} == {r["job_key"] for r in records}, out.stdout
    assert out.stdout.strip().splitlines()[-1].startswith("sweep adhoc: 2 points: 2 ok")


@pytest.mark.torchrun
def test_two_drivers_waiting_for_one_host_both_finish_and_neither_waits_past_its_bound(tmp_path, lock_env):
    """Two sweeps of different points on warm ranks, one host slot: a warm job keeps the host while the other
    driver has waited less than launch.reuse_idle_s, then gives it back after its turn. Both finish, every point
    ok, and no point waited for the host longer than reuse_idle_s plus the other's longest turn (and a start).
    One rank a point: a CPU point of any dp leases the host's one slot, and the turns are what is measured."""
    idle_s = 3.0
    common = [*FAST, "parallel.dp=1", "launch.reuse=true", f"launch.reuse_idle_s={idle_s}", "train.steps=2"]
    argv = [sys.executable, "-m", "scaling", "run", "-m", *common]
    drivers = [
        subprocess.Popen(
            [*argv, f"train.seed={seeds}", f"sweep_dir={tmp_path / name}"],
            cwd=tmp_path, env=lock_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name, seeds in (("a", "1,2"), ("b", "3,4"))
    ]  # fmt: skip
    outputs = [d.communicate(timeout=300)[0] for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], [o[-2000:] for o in outputs]
    records = [r for name in "ab" for r in iter_records(tmp_path / name)]
    assert len(records) == 4 and {r["status"] for r in records} == {"ok"}
    waits = [r["repeats"][0]["timing"]["device_wait_s"] for r in records]
    longest_turn = max(r["repeats"][0]["timing"]["torchrun_wall_s"] for r in records)
    bound = idle_s + longest_turn + 15.0  # the waiter's own warm job start, on a loaded 2-core host
    assert max(waits) <= bound, (waits, bound)
    assert any("waiting for cpu slots" in o or "waiting in line" in o for o in outputs)  # they did contend
    print(f"device waits {sorted(round(w, 1) for w in waits)} s; bound {bound:.1f} s")


@pytest.mark.subprocess
@pytest.mark.own_agent_servers
def test_killing_a_parallel_sweep_leaves_no_point_running(tmp_path, lock_env):
    sweep_dir = tmp_path / "killed"
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scaling",
            "run",
            "-m",
            "hydra/launcher=parallel",
            "hydra.launcher.n_jobs=2",
            *FAST,
            "train.fault=hang",
            "launch.timeout_s=120",
            "train.seed=1,2",
            f"sweep_dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=lock_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        family = psutil.Process(driver.pid).children(recursive=True)
        if any("scaling.engine.worker" in " ".join(p.cmdline()) for p in family if p.is_running()):
            break
        time.sleep(0.2)
    else:
        pytest.fail("no point of the sweep reached torchrun")
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    gone, alive = psutil.wait_procs(family, timeout=15)
    assert alive == [], f"outlived the killed sweep: {[' '.join(p.cmdline())[:120] for p in alive]}"
    assert list(sweep_dir.glob("*/result.json")) == []  # the hung point never finished, the other never ran


def test_a_planted_lock_file_or_a_lock_directory_others_control_is_refused(tmp_path, monkeypatch):
    """A lock file planted as a symbolic link (it would truncate what it points to), a lock directory that is a
    symbolic link, one of another owner, one others can write: each refused with a clear error naming it, before a
    lock is taken, and the file a planted link points to untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    (locks / "cpu-host.lock").symlink_to(victim)
    monkeypatch.setenv(LOCK_DIR_ENV, str(locks))
    held = lease(1, ["host"], kind="cpu")
    with pytest.raises(LockDirError, match=rf"device lock file {locks}/cpu-host.lock is a symbolic link \(to "):
        held.__enter__()
    assert victim.read_text() == "precious"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "linked").symlink_to(elsewhere)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)  # as root here; for a user, a directory another user made first
    for path, words in (
        (tmp_path / "linked", "is a symbolic link (to "),
        (shared, "has mode 1777: group or others can write or read its locks; chmod 700"),
        (theirs, f"belongs to uid 65534, not to this user (uid {os.getuid()}): another user made it"),
    ):
        with pytest.raises(LockDirError, match=re.escape(f"device lock directory {path} {words}")):
            checked_lock_dir({LOCK_DIR_ENV: str(path)})
    cfg = compose_point(["hardware.device=cpu"])
    with pytest.raises(LockDirError):  # a point is refused before anything starts
        request(cfg, {LOCK_DIR_ENV: str(theirs)})
    own = checked_lock_dir({"XDG_RUNTIME_DIR": str(elsewhere)})
    assert own == elsewhere / "scaling-devices" and stat.S_IMODE(own.stat().st_mode) == 0o700
