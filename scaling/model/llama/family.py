"""The built-in decoder as a family (scaling.model.spec): built from its `model` config (scaling.core.model_group's
ModelConfig), counted in closed form (args.py, flops.py), split into its `layers`, sharded by its own TP_PLAN
(decoder.py). The standard library only until it builds: the driver counts it without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scaling.core.model_group import ModelConfig, ModelGroup
from scaling.model.llama import flops
from scaling.model.llama.args import ModelArgs, param_count, param_shapes
from scaling.model.shape import Counted, ModelShape
from scaling.model.spec import Family

if TYPE_CHECKING:
    import torch
    from torch import nn


class Llama(Family):
    """The built-in decoder: closed forms for its counts and its shapes."""

    closed_form = True
    tp_outputs_owned = False  # its forward adds to a block's outputs out of place
    config: ModelConfig

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.args = ModelArgs.of(config)

    @classmethod
    def claims(cls, config: ModelGroup) -> bool:
        return isinstance(config, ModelConfig)

    def sizes(self) -> tuple[Any, Any]:
        return self.args.vocab_size, self.args.max_seq_len

    def build(self, device: torch.device | str) -> nn.Module:
        from scaling.model.llama.decoder import Transformer

        return Transformer(self.args, device=device)

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        return list(module.layers)

    def recompute(self, module: nn.Module, blocks: list[nn.Module], recompute: str, every: int) -> list[nn.Module]:
        module.set_recompute(recompute, every)  # the checkpoint sits inside each block's forward
        return blocks

    def initialise(self, module: nn.Module, seed: int) -> None:
        module.init_weights(seed)

    def stage_costs(self, seq_len: int) -> tuple[list[float], float, float]:
        """In closed form (flops.py): each block 6·(its matmul weights) + 12·h·seq, the head 6·h·V, the embedding 0."""
        return flops.stage_costs(self.args, seq_len)

    def pipeline_stage(self, module: nn.Module, blocks: range, first: bool, last: bool) -> nn.Module:
        from scaling.model.llama.decoder import Stage

        return Stage(module, blocks, first, last)

    def stage_blocks(self, stage: nn.Module) -> list[nn.Module]:
        return list(stage.layers.values())

    def check_pp(self, stages: int, n_blocks: int) -> None:
        """Nothing to build: the validation checks the blocks against the stages (scaling.core.validate)."""

    def tp_plan(self) -> dict[str, str]:
        from scaling.model.llama.decoder import TP_PLAN

        return dict(TP_PLAN)

    def check_tp(self, tp: int) -> None:
        """Nothing to build or import: its plan is its own (decoder.TP_PLAN) and the validation checks that the degree
        splits its heads and widths (scaling.core.model_group.ModelConfig.check_tp)."""

    def counted(self, seq_len: int) -> Counted:
        return Counted(
            n_params=param_count(self.args),
            flops_per_token=flops.flops_per_token(self.args, seq_len),
            recomputed_flops_per_token=flops.recomputed_flops_per_token(self.args, seq_len),
            attention_flops_per_token=flops.attention_flops_per_token(self.args, seq_len),
            recomputed_attention_flops_per_token=flops.recomputed_attention_flops_per_token(self.args, seq_len),
            block="Block",
            n_blocks=self.args.n_layers,
            tensors=param_shapes(self.config),
            source="closed_form",
        )

    def shape(self, seq_len: int) -> ModelShape:
        """From its config, whatever the sequence length: the embedding; per block attention_norm, wq, wk, wv, wo,
        ffn_norm, w1, w3, w2; the final norm; the output unless tied (scaling.model.llama.args.param_shapes)."""
        return ModelShape.cached(self.config.name, param_shapes(self.config), self.args.n_layers)
