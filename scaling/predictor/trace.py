"""Traced memory prediction: the real training step of a point, on fake tensors, one rank of a fake world.

The model's family (scaling.model), the ZeRO wrapping (scaling.engine.parallel) and the step (scaling.engine.step)
run under FakeTensorMode with a fake process group, measured by the worker's own tracker
(scaling.engine.memtrack): no tensor is allocated, so llama_8b at dp=512 is predicted in seconds, as the same
"peak of live tensor bytes" the worker reports on CPU. One plain step of one micro-step (it makes the optimizer's
state and the wrappers' lazy state, which a step of more micro-steps leaves the same), then one tracked step, at most
two micro-steps (three at ZeRO-2: `MAX_MICRO_STEPS`); eager mode. `trace_peak` runs in this process (its fake world
installed and removed: `_fake_world`); `trace_peak_isolated` in a fresh interpreter, as the pre-screen does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from scaling.core.enums import ZeroStage
from scaling.core.schema import ExperimentConfig
from scaling.predictor import TraceError

TRACED = "traced"
MAX_MICRO_STEPS = 2
"""Micro-steps traced per step: the second one already holds accumulated gradients. ZeRO-2 traces one more, since
its parameters stay gathered until the last micro-step: the second of three is one before the last with
accumulated gradient shards, which the last one (its parameters resharded after its backward) is not."""


@dataclass
class TracedPrediction:
    """Peak live bytes of one rank over one tracked step, and what was live at the peak."""

    peak_mem_bytes: int
    breakdown: dict[str, int] = field(default_factory=dict)
    """Tracker categories at the peak (params, grads, optimizer, activations, temporaries, ...)."""
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON and records."""
        return {"method": TRACED, **asdict(self)}


def _category(key: str) -> str:
    """'_FSDPRefType.UNSHARDED_PARAM' -> 'unsharded_param'."""
    return key.rsplit(".", 1)[-1].lower()


class _LazyChunks:
    """`torch.chunk(t, n, dim)` padded with empty tensors to n entries, each made when indexed.

    FSDP2 chunks every parameter into `dp` views and keeps one; on fake tensors each view costs
    ~0.1 ms, which at dp=512 is most of a trace. The views made here are the same views.
    """

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim
        self.size = tensor.size(dim)
        self.chunk = -(-self.size // num_chunks)  # torch.chunk's chunk size

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, i: int) -> torch.Tensor:
        start = i * self.chunk
        if start >= self.size:  # fewer chunks than ranks: an empty one, as _chunk_with_empty pads
            return self.tensor.narrow(self.dim, 0, min(self.chunk, self.size)).new_empty(0)
        return self.tensor.narrow(self.dim, start, min(self.chunk, self.size - start))


class _LocalBucketRebuild:
    """DDP's reducer, with its one bucket rebuild (in the second step's first forward) made without the other ranks.

    The real rebuild exchanges bucket indices with the other ranks and reads them back, which fake tensors cannot
    do; this one keeps the buckets of construction (the same bytes, in construction order instead of backward
    order). What the rebuild costs in memory it does make: once `armed`, the next forward allocates the new buckets
    (the gradients' bytes) while the old ones still hold the gradients, then frees them, as the real rebuild frees
    the old ones.
    """

    def __init__(self, reducer: Any, params: list[torch.Tensor]) -> None:
        self._reducer, self._params, self.armed = reducer, params, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        if self.armed:
            self.armed = False
            numel = sum(p.numel() for p in self._params)
            new_buckets = torch.empty(numel, dtype=self._params[0].dtype, device=self._params[0].device)
            del new_buckets
        return False


def _completed_allreduce(dp: int):
    """DDP comm hook for the fake group: average the bucket in place and complete at once.

    The built-in hook returns the fake group's future, which carries no tensor; in place is what
    the built-in hook does to the bucket too, so the bytes are the same. (No annotations on the
    hook: DDP checks them at runtime and would see strings here.)
    """

    def hook(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer().div_(dp))
        return fut

    return hook


def _peak_only_update(self: Any, peak_state: Any) -> None:
    """MemTracker._update_peak_stats without the per-module peaks, which cost O(modules) per op;
    the step's overall peak, the only figure read, is kept exactly as torch keeps it."""
    from copy import deepcopy

    for dev, snap in self._curr_mem_snap.items():
        if self._peak_mem.get(dev, 0) < snap["Total"]:
            self._peak_mem[dev] = snap["Total"]
            self._peak_mem_snap[dev] = deepcopy(snap)


class _FusedRMSNormShapes(torch.autograd.Function):
    """What CUDA's fused RMSNorm kernel (`aten._fused_rms_norm`, which `F.rms_norm` runs there) allocates and keeps,
    for a trace on fake tensors: the output and a (rows, 1) fp32 rstd in forward, the input and rstd saved for
    backward, the input's and the weight's gradients in backward. On CPU the op decomposes into pow, mean, rsqrt and
    two muls that keep more (see scaling.predictor.analytic._norm_saved_on_cpu_only). Shapes and dtypes only: the
    trace computes no values, and this is installed only while it runs (`_cuda_kernels`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, dims: int) -> torch.Tensor:
        rstd = x.new_empty((*x.shape[: x.dim() - dims], *([1] * dims)), dtype=torch.float32)
        ctx.save_for_backward(x, weight, rstd)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight), None


@contextlib.contextmanager
def _cuda_kernels() -> Iterator[None]:
    """Trace a CUDA point's step with what differs on CUDA in what tensors live: RMSNorm's fused kernel (where the
    input's and the weight's dtypes match, as the fused path requires; otherwise torch's composite, as on CUDA).
    AdamW's fused kernel is chosen at build (`parallelize(fused_optimizer=True)`)."""
    import torch.nn.functional as F

    composite = F.rms_norm

    def rms_norm(x: torch.Tensor, normalized_shape: Any, weight: Any = None, eps: Any = None) -> torch.Tensor:
        if weight is None or weight.dtype != x.dtype:
            return composite(x, normalized_shape, weight, eps)
        return _FusedRMSNormShapes.apply(x, weight, len(normalized_shape))

    with _patched(F, "rms_norm", rms_norm):
        yield


@contextlib.contextmanager
def _gloo_collectives() -> Iterator[None]:
    """Trace a gloo point's step with what gloo's reduce-scatter holds: it reduces a copy of its whole input (an
    all-reduce of the copy, then the rank's chunk copied out), which the fake process group's collective does not.
    FSDP2 calls `reduce_scatter_single` (torch 2.13) or `reduce_scatter_tensor` (earlier), and one may call the
    other: the outermost call makes the copy."""
    depth = 0

    def with_copy(collective: Any) -> Any:
        def reduce_scatter(output: torch.Tensor, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            nonlocal depth
            copy = input.clone() if depth == 0 else None  # gloo's buffer, alive while the collective runs
            depth += 1
            try:
                return collective(output, input, *args, **kwargs)
            finally:
                depth -= 1
                del copy

        return reduce_scatter

    with contextlib.ExitStack() as stack:
        for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
            if hasattr(dist, name):
                stack.enter_context(_patched(dist, name, with_copy(getattr(dist, name))))
        yield


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, original)


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """Put `os.environ` back as it was: parts of torch set variables for this process when imported (inductor's
    TORCHINDUCTOR_CACHE_DIR), and the sweep driver's environment decides which warm job a point joins."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        os.environ.update(before)


@contextlib.contextmanager
def _fake_world(dp: int, rank: int = 0) -> Iterator[Any]:
    """A fake process group of `dp` ranks (this process is rank `rank`) and a FakeTensorMode; on exit
    everything is undone. Adjusted torch internals, for this block only:

    - DDP's shape check across ranks reads tensor data: skipped (every rank builds the same model);
    - FSDP2 builds its default device mesh from a tensor, on the host's accelerator: a CPU mesh, built outside fake
      mode; so is a point's own mesh (hybrid sharding, tensor parallelism: scaling.engine.tensor_parallel), and any
      mesh FSDP2 makes of it;
    - FSDP2's per-rank chunking of each parameter: `_LazyChunks` (same views, made on demand);
    - MemTracker's per-module peak bookkeeping: `_peak_only_update` (same overall peak);
    - DTensor's advice to flatten a 2D mesh (a warning each time the gradient norm of a tp × shard mesh is reduced):
      silenced, or a recipe's traces print it dozens of times.
    """
    import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param
    import torch.distributed.fsdp._fully_shard._fully_shard as fully_shard_mod
    import torch.nn.parallel.distributed as ddp_mod
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import scaling.engine.parallel as parallel_mod
    from scaling.engine.tensor_parallel import point_mesh

    if dist.is_initialized():
        raise TraceError(
            "the traced predictor needs a process without a process group: "
            "use trace_peak_isolated() inside a distributed job"
        )

    def real_mesh(mesh_dim_names: Any = None) -> Any:
        # on the CPU whatever accelerator the host has: torch's default mesh is the accelerator's, and FSDP2 then
        # expects the (CPU, fake) parameters on it
        with unset_fake_temporarily():
            return init_device_mesh("cpu", mesh_shape=(dist.get_world_size(),), mesh_dim_names=mesh_dim_names)

    def real_point_mesh(parallel: Any, device: Any) -> Any:
        with unset_fake_temporarily():
            return point_mesh(parallel, torch.device("cpu"))

    mesh_init = DeviceMesh.__init__

    def real_mesh_init(self: Any, *args: Any, **kwargs: Any) -> None:  # FSDP2 joins a TP mesh to its own
        with unset_fake_temporarily():
            mesh_init(self, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(ddp_mod, "_verify_param_shape_across_processes", lambda *a, **k: None))
        stack.enter_context(_patched(parallel_mod, "point_mesh", real_point_mesh))
        stack.enter_context(_patched(DeviceMesh, "__init__", real_mesh_init))
        stack.enter_context(_patched(fully_shard_mod, "_init_default_mesh", real_mesh))
        stack.enter_context(_patched(fsdp_param, "_chunk_with_empty", _LazyChunks))
        stack.enter_context(_patched(MemTracker, "_update_peak_stats", _peak_only_update))
        advice = logging.getLogger("torch.distributed.tensor._redistribute")
        stack.callback(advice.setLevel, advice.level)
        advice.setLevel(logging.ERROR)
        # init_process_group wraps sys.excepthook to prefix "[rank0]: " to every line of an uncaught error's
        # traceback, and leaves it so: a driver that traced n points said "[rank0]: " n times on a line (Ctrl-C)
        stack.callback(setattr, sys, "excepthook", sys.excepthook)
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=dp)
        stack.callback(dist.destroy_process_group)
        yield stack.enter_context(FakeTensorMode())


@contextlib.contextmanager
def _plan_refused(cfg: ExperimentConfig, family: Any) -> Iterator[None]:
    """A model one brings whose first training step under its tensor-parallel plan fails here, on fake tensors, fails
    so on its ranks (a forward that reads the config's head count, a fused projection split where its parts do not
    line up): InvalidConfig, one line, so the point is refused before launch."""
    if family.closed_form or cfg.parallel.tp == 1:  # the built-in family's plan is the project's own
        yield
        return
    try:
        yield
    except Exception as e:
        from scaling.core.validate import InvalidConfig

        said = (
            f"parallel.tp={cfg.parallel.tp}: the first training step of model {cfg.model.name!r} under its "
            f"tensor-parallel plan fails (traced on fake tensors, as its ranks would run it): {type(e).__name__}: {e}"
        ).splitlines()[0]
        raise InvalidConfig(
            [
                f"{said}; a forward must take each rank's heads from the tensors (view(B, T, -1, head_dim)), and a fused "
                "projection split only where its parts line up (docs/own-project.md, Tensor parallelism)"
            ]
        ) from e


def trace_peak(cfg: ExperimentConfig) -> TracedPrediction:
    """Peak live bytes per rank of a resolved point's training step, traced on fake tensors in this process, whose
    environment variables it leaves as it found them (the parts of torch it imports set some). A model one brings
    whose step raises here raises TraceError, one line naming the model, the error and its line in the model's code:
    its ranks may fail so, or run (a model that branches on values runs for real where fake tensors cannot)."""
    from scaling.core.validate import InvalidConfig
    from scaling.model.family import family_of
    from scaling.model.spec import raised_at

    with _environment_kept():
        try:
            return _trace_peak(cfg)
        except (InvalidConfig, TraceError):
            raise
        except Exception as e:
            if family_of(cfg.model).closed_form:  # the project's own model: a fault here is the project's
                raise
            said = f"the traced training step of model {cfg.model.name!r} raised {type(e).__name__}: {e}"
            raise TraceError(said.splitlines()[0] + raised_at(e)) from e


def _trace_peak(cfg: ExperimentConfig) -> TracedPrediction:
    from scaling.core.validate import validate
    from scaling.engine.data import GlobalBatch, step_batches
    from scaling.engine.memtrack import tracked_step
    from scaling.engine.parallel import parallelize
    from scaling.engine.step import train_step
    from scaling.model.family import family_of

    t0 = time.perf_counter()
    grad_acc = validate(cfg, host=False).grad_acc
    train, par = cfg.train, cfg.parallel
    micro_steps = min(grad_acc, MAX_MICRO_STEPS + (par.zero_stage == ZeroStage.GRADIENTS))
    mbs, dp = train.mbs, par.layout.world_size
    cpu, cuda = torch.device("cpu"), cfg.hardware.device == "cuda"
    gloo = _gloo_collectives() if cfg.hardware.backend == "gloo" else contextlib.nullcontext()
    family = family_of(cfg.model)
    with (
        _fake_world(dp, _traced_rank(cfg, family)),
        _cuda_kernels() if cuda else contextlib.nullcontext(),
        gloo,
        family.as_on_real_tensors(),
    ):
        # The worker's build order; fake tensors hold no memory, so the shapes are made on the fake device.
        no_compile = dataclasses.replace(train, compile=False)
        wrapped = parallelize(cfg.model, no_compile, par, cpu, on_meta=False, fused_optimizer=cuda)
        if par.zero_stage < ZeroStage.GRADIENTS:
            wrapped.model.register_comm_hook(None, _completed_allreduce(dp))
            params = [p for p in wrapped.model.parameters() if p.requires_grad]
            wrapped.model.reducer = _LocalBucketRebuild(wrapped.model.reducer, params)
        data = GlobalBatch(family.vocab_size(), train.seq_len, train.seed)  # token values do not matter
        with _plan_refused(cfg, family):
            train_step(wrapped, step_batches(data, 0, 0, mbs, 1))
        micro_batches = step_batches(data, 1, 0, mbs, micro_steps)  # built before the step, as the worker does
        if par.zero_stage < ZeroStage.GRADIENTS:
            wrapped.model.reducer.armed = True  # DDP rebuilds its buckets in the second step's first forward
        with tracked_step(wrapped.model, wrapped.optimizer, par.zero_stage >= ZeroStage.GRADIENTS, None) as peak:
            train_step(wrapped, micro_batches, peak.new_micro_step)
    breakdown = {_category(k): v for k, v in peak.breakdown.items() if k != "Total" and v}
    return TracedPrediction(int(peak.peak_bytes), breakdown, time.perf_counter() - t0)


def _traced_rank(cfg: ExperimentConfig, family: Any) -> int:
    """The rank whose step is traced: at ZeRO-1 the one ZeroRedundancyOptimizer gives the most elements (whole
    tensors: it holds more than its share, docs/memory.md), else rank 0 (every rank holds the same)."""
    from scaling.predictor.model_state import zero1_partition

    dp = cfg.parallel.layout.world_size
    if cfg.parallel.zero_stage != ZeroStage.OPTIMIZER or dp == 1:
        return 0
    numels = tuple(rows * cols for _, _, rows, cols in family.counted(cfg.train.seq_len).tensors)
    parts = zero1_partition(numels, dp)
    return max(range(dp), key=lambda r: sum(parts[r]))


TRACES_DIR = "traces"
"""Where `trace_peak_kept` keeps a sweep directory's traces: `<sweep_dir>/traces/<job key>.json`."""


def trace_peak_kept(cfg: ExperimentConfig, sweep_dir: str | os.PathLike) -> TracedPrediction:
    """`trace_peak`, kept in `sweep_dir`: a trace is a function of the point's configuration (its job key, as its
    record is) and of torch's version, so a second `scaling recipe` in the directory reads what the first traced
    instead of tracing it again. A file of another torch, or one that cannot be read, is traced and written anew."""
    from scaling.core.files import read_json, write_json_atomic
    from scaling.store.record import job_key

    path = Path(sweep_dir) / TRACES_DIR / f"{job_key(cfg)}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        doc = read_json(path)
        if doc["torch"] == torch.__version__:
            breakdown = {str(k): int(v) for k, v in doc["breakdown"].items()}
            return TracedPrediction(int(doc["peak_mem_bytes"]), breakdown, float(doc.get("wall_s", 0.0)))
    traced = trace_peak(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"torch": torch.__version__, **traced.as_dict()})
    return traced


def trace_peak_isolated(cfg: ExperimentConfig, timeout_s: float = 300.0) -> TracedPrediction:
    """`trace_peak` in a fresh interpreter (`python -m scaling.predictor.trace`): no process group or patch leaks here."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "scaling.predictor.trace"],
            input=json.dumps(cfg.to_dict()),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise TraceError(f"the traced prediction took longer than {timeout_s:g}s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise TraceError(f"the traced prediction failed: {lines[-1] if lines else f'exit code {proc.returncode}'}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.pop("method")
    return TracedPrediction(**out)


def main() -> None:
    """`python -m scaling.predictor.trace`: a resolved config as JSON on stdin -> the prediction as JSON on stdout."""
    from scaling.core.schema import ExperimentConfig

    cfg = ExperimentConfig.from_dict(json.loads(sys.stdin.read()))
    print(json.dumps(trace_peak(cfg).as_dict()))


if __name__ == "__main__":
    main()
