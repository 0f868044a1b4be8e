"""A point's parallel layout, one value of one type (torchtitan's ParallelDims is the model): the ZeRO stage, the
data-parallel ranks and the ranks each shard spans, tensor parallelism, and room for pipeline and context
parallelism. It owns the arithmetic every part shares: the world size (dp × tp × pp × cp), GPUs ↔ dp ranks, the shard
group, its name, its `scaling run` overrides and its identity (the frozen value itself). Nothing else multiplies
degrees. Standard library only (docs/architecture.md: adding a parallel axis).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from scaling.core.enums import ZeroStage

MODEL_PARALLEL = ("tp", "pp", "cp")
"""The degrees that split one data-parallel rank's model over GPUs (its model-parallel group)."""
AXES = ("zero_stage", "dp", "dp_shard", *MODEL_PARALLEL)
"""The `parallel` config group's fields a layout is made of."""


@dataclass(frozen=True)
class Layout:
    """How a point's GPUs (ranks) hold the model and split the batch. Equal layouts are one configuration."""

    zero_stage: ZeroStage = ZeroStage.NONE
    """What data parallelism shards: 0 nothing (DDP), 1 optimizer states, 2 also gradients, 3 also parameters."""
    dp: int = 1
    """Data-parallel ranks: replicas × shard group (each a whole tp × pp × cp group of GPUs)."""
    dp_shard: Optional[int] = None
    """The dp ranks each ZeRO-1/2/3 shard spans (hybrid sharding); None: all dp ranks (full sharding)."""
    tp: int = 1
    """Tensor-parallel GPUs of each dp rank (consecutive ranks, within a node)."""
    pp: int = 1
    """Pipeline stages (room for the axis: 1)."""
    cp: int = 1
    """Context-parallel GPUs (room for the axis: 1)."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.zero_stage, int)
            and not isinstance(self.zero_stage, ZeroStage)
            and 0 <= self.zero_stage <= 3
        ):
            object.__setattr__(self, "zero_stage", ZeroStage(self.zero_stage))
        if self.dp_shard is not None and self.dp_shard == self.dp:  # over every rank: full sharding, one identity
            object.__setattr__(self, "dp_shard", None)

    @classmethod
    def of(cls, parallel: Any) -> Layout:
        """The layout of a `parallel` config group (scaling.core.schema.ParallelConfig, or its plain dict as a record
        holds it: fields it lacks are at their neutral values)."""
        get = parallel.get if isinstance(parallel, Mapping) else lambda k, d=None: getattr(parallel, k, d)
        return cls(
            zero_stage=get("zero_stage", 0),
            dp=get("dp", 1),
            dp_shard=get("dp_shard"),
            tp=get("tp", 1) or 1,
            pp=get("pp", 1) or 1,
            cp=get("cp", 1) or 1,
        )

    @classmethod
    def over(
        cls,
        gpus: int,
        zero_stage: int = 0,
        *,
        shard_group: Optional[int] = None,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
    ) -> Optional[Layout]:
        """The layout of `gpus` GPUs at these model-parallel degrees: dp = gpus / (tp × pp × cp), shards of
        `shard_group` dp ranks where that is a proper divisor of dp (else full sharding); None where the degrees do
        not divide the GPUs."""
        group = tp * pp * cp
        if gpus < group or gpus % group:
            return None
        return cls(zero_stage, gpus // group, None, tp, pp, cp).with_shard_group(shard_group)

    def at(self, gpus: int) -> Optional[Layout]:
        """The same layout spread over `gpus` GPUs (its shard group kept where it divides the new dp: `over`)."""
        return Layout.over(gpus, self.zero_stage, shard_group=self.dp_shard, tp=self.tp, pp=self.pp, cp=self.cp)

    @property
    def model_parallel(self) -> int:
        """GPUs of one data-parallel rank: tp × pp × cp."""
        return self.tp * self.pp * self.cp

    @property
    def world_size(self) -> int:
        """Ranks (GPUs) of the point: dp × tp × pp × cp."""
        return self.dp * self.model_parallel

    @property
    def shard_size(self) -> int:
        """dp ranks one ZeRO shard spans: dp_shard, or dp (full sharding)."""
        return self.dp_shard or self.dp

    @property
    def replicas(self) -> int:
        """Groups that each hold a whole copy of what is sharded: dp / shard_size (1: full sharding)."""
        return self.dp // self.shard_size

    @property
    def hybrid(self) -> bool:
        """Whether shards span fewer dp ranks than there are (hybrid sharding)."""
        return self.dp_shard is not None

    @property
    def axes(self) -> int:
        """Parallel axes in use besides data parallelism and the ZeRO stage: hybrid sharding, tp, pp, cp (a tie in
        the recipe goes to the fewest)."""
        return int(self.hybrid) + sum(getattr(self, axis) > 1 for axis in MODEL_PARALLEL)

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 holds the model (ZeRO-2 and 3); ZeRO-0/1 run DDP."""
        return self.zero_stage >= ZeroStage.GRADIENTS

    def per_gpu(self, per_dp_rank: float) -> float:
        """A dp rank's figure (tokens, samples) shared by its model-parallel GPUs: per GPU."""
        return per_dp_rank / self.model_parallel

    @property
    def name(self) -> str:
        """Every axis that is not neutral, e.g. `ZeRO-2 (shard over 32), tp 2 × dp 256`; plain data parallelism
        names no dp (the GPU count says it)."""
        split = self._split()
        return self._stage() + (f", {' × '.join([*split, f'dp {self.dp}'])}" if split else "")

    @property
    def kind(self) -> str:
        """The name without its dp: what stays the same across GPU counts (`ZeRO-2 (shard over 32), tp 2`)."""
        return ", ".join([self._stage(), *self._split()])

    def _stage(self) -> str:
        return f"ZeRO-{int(self.zero_stage)}" + (f" (shard over {self.dp_shard})" if self.dp_shard else "")

    def _split(self) -> list[str]:
        return [f"{axis} {getattr(self, axis)}" for axis in MODEL_PARALLEL if getattr(self, axis) > 1]

    def parallel(self) -> dict[str, Any]:
        """The `parallel` config group's fields this layout sets (cfg.changed(parallel=...)); pp and cp only when
        not neutral."""
        values: dict[str, Any] = {"zero_stage": int(self.zero_stage), "dp": self.dp, "dp_shard": self.dp_shard}
        return values | {
            axis: getattr(self, axis) for axis in MODEL_PARALLEL if axis == "tp" or getattr(self, axis) > 1
        }

    def overrides(self) -> list[str]:
        """The `scaling run` overrides of this layout (only the axes that are not neutral, besides dp and stage)."""
        out = [f"parallel.dp={self.dp}"]
        out += [f"parallel.{axis}={getattr(self, axis)}" for axis in MODEL_PARALLEL if getattr(self, axis) > 1]
        out.append(f"parallel.zero_stage={int(self.zero_stage)}")
        return out + ([f"parallel.dp_shard={self.dp_shard}"] if self.dp_shard else [])

    def ranks(self, total: bool = True) -> str:
        """The world as the product of its degrees: `parallel.dp=2`, or `parallel.dp=2 x parallel.tp=2 = 4` (without
        ` = 4` when not `total`)."""
        split = [f"parallel.{axis.replace(' ', '=')}" for axis in self._split()]
        product = " x ".join([f"parallel.dp={self.dp}", *split])
        return product + (f" = {self.world_size}" if split and total else "")

    def with_dp(self, dp: int) -> Layout:
        """This layout at `dp` data-parallel ranks (its shard group kept where it is a proper divisor of them)."""
        return replace(self, dp=dp).with_shard_group(self.dp_shard)

    def with_shard_group(self, ranks: Optional[int]) -> Layout:
        """This layout with shards of `ranks` dp ranks where that is a proper divisor of dp (hybrid), else full
        sharding."""
        return replace(self, dp_shard=_group_within(ranks, self.dp))

    def coordinates(self, rank: int) -> tuple[int, int]:
        """(dp rank, tp rank) of a global rank. Ranks are numbered pp outermost, then dp, then tp (torchtitan's mesh
        order): tp consecutive ranks form a tensor-parallel group, and a pipeline stage's dp × tp ranks are
        consecutive, so stages are the groups that cross nodes first."""
        return (rank // self.tp) % self.dp, rank % self.tp

    def stage_of(self, rank: int) -> int:
        """The pipeline stage a global rank runs (0 at pp 1): rank // (dp × tp)."""
        return rank // (self.dp * self.tp)


def _group_within(shard_group: Optional[int], dp: int) -> Optional[int]:
    """A shard group of `shard_group` dp ranks where it is a proper divisor of dp (hybrid), else None (full)."""
    return shard_group if shard_group and shard_group < dp and dp % shard_group == 0 else None


def configuration_name(
    layout: Layout, recompute: str, mbs: Optional[int] = None, grad_acc: Optional[int] = None
) -> str:
    """The one name of a configuration: `ZeRO-2 (shard over 32), tp 2 × dp 256, mbs 1, grad_acc 4, recompute none`
    (mbs and grad_acc where known)."""
    batch = (f", mbs {mbs}" if mbs is not None else "") + (f", grad_acc {grad_acc}" if grad_acc is not None else "")
    return f"{layout.name}{batch}, recompute {recompute}"
