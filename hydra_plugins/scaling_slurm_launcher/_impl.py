"""The launch loop of `launcher.ScalingSlurmLauncher`: submit in throttled arrays, collect each task as it ends."""

from __future__ import annotations

import logging
import os
import subprocess
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from scaling.store import inflight
from scaling.sweep import progress

log = logging.getLogger(__name__)

POLL_S = 1.0
"""How often the driver looks for finished tasks."""
GONE_GRACE_S = 10.0
"""How long a task squeue no longer lists may take to show its result file before it counts as lost."""


class _Shared:
    """What every task of a launch needs (the launcher, Hydra's global state), in one file."""

    _loaded: dict[str, tuple[Any, dict]] = {}

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self, overrides: list[str], num: int) -> JobReturn:
        """Run job number `num` of the sweep (in a SLURM task); its JobReturn without the composed configs."""
        from submitit.core.utils import pickle_load

        if self.path not in self._loaded:
            self._loaded[self.path] = pickle_load(self.path)
        launcher, singleton_state = self._loaded[self.path]
        ret = launcher(overrides, "hydra.sweep.dir", num, f"job_id_for_{num}", singleton_state)
        ret.cfg = ret.hydra_cfg = None  # the driver needs the return value (the record), not 2 configs per point
        return ret

    def checkpoint(self, overrides: list[str], num: int) -> Any:
        """Requeue the point as it was submitted when SLURM preempts its task (as hydra-submitit does)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, overrides, num)


@dataclass
class _Array:
    """A submitted job array: its unfinished tasks by job number, and its current throttle."""

    array_id: str
    """The SLURM job id of the array (of the one job, for a chunk of one point)."""
    throttle: int
    """Tasks of the array SLURM runs at once."""
    jobs: dict[int, Any]
    lost_since: dict[int, float] = field(default_factory=dict)


def _result(job: Any) -> JobReturn:
    """The JobReturn a task pickled (a failed one if the task raised outside the job)."""
    from submitit.core.utils import FailedJobError, pickle_load

    outcome, value = pickle_load(job.paths.result_pickle)
    if outcome == "success":
        return value
    return JobReturn(status=JobStatus.FAILED, _return_value=FailedJobError(f"SLURM job {job.job_id} failed:\n{value}"))


def private_folder(template: str) -> Path:
    """The submitit folder's fixed part (`<sweep>/.submitit` of `<sweep>/.submitit/%j`), made 0700 whatever the
    umask: the driver and every task load pickles from it, so nobody else may write there. A symbolic link, or a
    folder of another user, is refused (ValueError naming it) before anything is submitted."""
    parts = Path(template).parts
    fixed = Path(*parts[: next((i for i, p in enumerate(parts) if "%" in p), len(parts))])
    fixed.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = fixed.lstat()
    if fixed.is_symlink() or not fixed.is_dir():
        raise ValueError(f"hydra.launcher.submitit_folder: {fixed} is not a directory of its own (a symbolic link?)")
    if st.st_uid != os.getuid():
        raise ValueError(
            f"hydra.launcher.submitit_folder: {fixed} belongs to uid {st.st_uid}, not to this user (uid "
            f"{os.getuid()}): its pickles would be loaded; use a sweep directory of your own"
        )
    fixed.chmod(0o700)
    return fixed


def executor(launcher: Any) -> Any:
    """A submitit executor with the launcher's parameters, built as hydra-submitit builds it, its folder private."""
    import submitit

    params = launcher.params
    private_folder(str(params["submitit_folder"]))
    init_keys = {"submitit_folder", "max_num_timeout"}
    ex = submitit.AutoExecutor(
        folder=params["submitit_folder"], cluster=launcher._EXECUTOR, slurm_max_num_timeout=params["max_num_timeout"]
    )
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    ex.update_parameters(
        **{k if k in base else f"{launcher._EXECUTOR}_{k}": v for k, v in params.items() if k not in init_keys}
    )
    return ex


SHAPE_KEYS = ("nodes", "gpus_per_node", "cpus_per_task", "timeout_min")
"""The launcher settings that conf/hydra/launcher/slurm.yaml derives from a point's own config."""

Shape = tuple[tuple[str, Any], ...]
"""A point's SLURM resources: (setting, value) for each of SHAPE_KEYS the launcher derives per point."""


def point_shapes(launcher: Any, job_overrides: Sequence[Sequence[str]]) -> list[Shape]:
    """Each point's SLURM resources, from its own config.

    Hydra resolves `hydra.launcher` once, against the sweep's primary config, so `nodes: ${...parallel.dp...}`
    would give every point of a sweep over dp the resources of the primary config's dp. Each setting of
    SHAPE_KEYS that is an interpolation is resolved here against each point's config instead (composed once
    per config-group choice, scaling.sweep.grid.PointConfigs); a setting given a plain value holds for every point.
    """
    from omegaconf import OmegaConf

    from scaling.launch import slurm
    from scaling.sweep.grid import PointConfigs

    slurm.register_resolvers()
    node = launcher.config.hydra.launcher
    raw = OmegaConf.to_container(node, resolve=False)
    derived = {k: raw[k] for k in SHAPE_KEYS if k in node and OmegaConf.is_interpolation(node, k)}
    if not derived:
        return [()] * len(job_overrides)
    configs = PointConfigs(launcher.hydra_context.config_loader, launcher.config)
    shapes: list[Shape] = []
    for overrides in job_overrides:
        point = OmegaConf.create({**configs.resolved(overrides), "_slurm": derived})
        shapes.append(tuple(OmegaConf.to_container(point["_slurm"], resolve=True).items()))
    return shapes


def launch_in_arrays(
    launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int, array_chunk: int
) -> list[JobReturn]:
    """Submit the points in throttled arrays, one resource shape per array; return their JobReturns once
    every one has ended."""
    from submitit.core.utils import JobPaths, cloudpickle_dump

    ex = executor(launcher)
    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    shared = JobPaths.get_first_id_independent_folder(ex.folder) / f"launcher-{uuid.uuid4().hex}.pkl"
    shared.parent.mkdir(parents=True, exist_ok=True)
    cloudpickle_dump((launcher, Singleton.get_state()), shared)
    task = _Shared(shared)
    shapes = point_shapes(launcher, job_overrides)
    todo = deque((initial_job_idx + i, list(o), shape) for i, (o, shape) in enumerate(zip(job_overrides, shapes)))
    at_once = int(launcher.params["array_parallelism"])
    arrays: list[_Array] = []
    returns: dict[int, JobReturn] = {}
    tracker = progress.driver_progress(launcher.hydra_context)
    while todo or arrays:
        unfinished = sum(len(a.jobs) for a in arrays)
        if todo and unfinished < at_once:
            shape, chunk = _next_chunk(todo, array_chunk)
            arrays.append(_submit(ex, task, chunk, shape, at_once - unfinished, tracker))
            continue
        _collect(arrays, returns, tracker)
        arrays = [a for a in arrays if a.jobs]
        _rethrottle(arrays, at_once)
        if arrays:
            time.sleep(POLL_S)
    shared.unlink()
    return [returns[initial_job_idx + i] for i in range(len(job_overrides))]


def _next_chunk(todo: deque, array_chunk: int) -> tuple[Shape, list[tuple[int, list[str]]]]:
    """Take the next array's points off `todo`: up to `array_chunk` points of the first waiting point's
    shape, in job order (points of other shapes keep their place)."""
    shape = todo[0][2]
    chunk, rest = [], deque()
    while todo:
        num, overrides, other = todo.popleft()
        if other == shape and len(chunk) < array_chunk:
            chunk.append((num, overrides))
        else:
            rest.append((num, overrides, other))
    todo.extend(rest)
    return shape, chunk


def _submit(
    ex: Any,
    task: _Shared,
    chunk: list[tuple[int, list[str]]],
    shape: Shape,
    throttle: int,
    tracker: Optional[progress.Progress],
) -> _Array:
    ex.update_parameters(slurm_array_parallelism=throttle, **dict(shape))
    jobs = ex.map_array(task, [o for _, o in chunk], [num for num, _ in chunk])
    for (num, _), job in zip(chunk, jobs):
        if tracker is not None:
            tracker.submitted(num, job.job_id)
    array_id = jobs[0].job_id.split("_")[0]
    log.info(
        "SLURM job array %s: %d points (first %d, last %d), %s, at most %d at once",
        array_id,
        len(chunk),
        chunk[0][0],
        chunk[-1][0],
        ", ".join(f"{k}={v}" for k, v in shape) or "the launcher's resources",
        throttle,
    )
    return _Array(array_id, throttle, {num: job for (num, _), job in zip(chunk, jobs)})


def _collect(arrays: list[_Array], returns: dict[int, JobReturn], tracker: Optional[progress.Progress]) -> None:
    """Take every task that ended since the last look: its result, or a failure if SLURM lost it."""
    states = inflight.slurm_states(a.array_id for a in arrays)
    for array in arrays:
        for num, job in list(array.jobs.items()):
            if job.paths.result_pickle.exists():
                ret = _result(job)
            elif states is not None and job.job_id not in states:
                lost = array.lost_since.setdefault(num, time.monotonic())
                if time.monotonic() - lost < GONE_GRACE_S:
                    continue
                ret = JobReturn(
                    status=JobStatus.FAILED,
                    _return_value=RuntimeError(
                        f"SLURM job {job.job_id} ended without a result (cancelled, past its time limit or its node "
                        f"failed): see {job.paths.stdout}"
                    ),
                )
            else:
                continue
            del array.jobs[num]
            returns[num] = ret
            if tracker is not None:
                tracker.ended(num, ret)


def _rethrottle(arrays: list[_Array], at_once: int) -> None:
    """Let the newest array run what the older ones leave of `at_once`."""
    if not arrays or "_" not in next(iter(arrays[-1].jobs.values())).job_id:
        return  # done, or a lone job (a chunk of one point) that has no throttle
    newest, older = arrays[-1], sum(len(a.jobs) for a in arrays[:-1])
    throttle = at_once - older
    if throttle != newest.throttle:
        done = subprocess.run(
            ["scontrol", "update", f"JobId={newest.array_id}", f"ArrayTaskThrottle={throttle}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode == 0:
            newest.throttle = throttle
        else:
            log.warning(
                "could not raise the throttle of SLURM array %s to %d: %s",
                newest.array_id,
                throttle,
                done.stderr.strip(),
            )
