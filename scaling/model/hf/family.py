"""A Hugging Face causal LM from its config (`hf_config:`) as a family (scaling.model.spec): a module the user brings
whose factory is the project's (causal_lm.py), whose sizes, longest sequence, tensor-parallel plan and widths are read
through transformers (config.py) where the model file gives none, and whose attention transformers chooses."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, ContextManager, Optional

from scaling.core.model_group import HF_TARGET, CustomModel, ModelConfig, ModelGroup
from scaling.model.custom.family import OwnModule
from scaling.model.shape import ModelShape

if TYPE_CHECKING:
    from torch import nn


class HuggingFace(OwnModule):
    """A causal LM that transformers builds from a config file alone (no weights)."""

    @classmethod
    def claims(cls, config: ModelGroup) -> bool:
        return isinstance(config, CustomModel) and config.target == HF_TARGET

    def load_code(self) -> None:
        """The factory's module and the modeling module of the config's type: what transformers imports when it first
        builds one (tens of MB resident), imported before a rank's memory baseline."""
        from scaling.model.hf.causal_lm import load_modeling

        super().load_code()
        load_modeling(**self.config.kwargs)

    def sizes(self) -> tuple[Any, Any]:
        """The model file's, else what transformers reads of the config (GPT-2's `n_positions`; None: the model has no
        longest sequence, as BLOOM)."""
        vocab, longest = super().sizes()
        if vocab is None or longest is None:
            from scaling.model.hf.config import read_config

            read_vocab, read_longest = read_config(**self.config.kwargs).sizes()
            vocab, longest = read_vocab if vocab is None else vocab, read_longest if longest is None else longest
        return vocab, longest

    def longest_name(self) -> str:
        if self.config.max_seq_len is not None:
            return super().longest_name()
        from scaling.model.hf.config import read_config

        kwargs = self.config.kwargs
        return f"{read_config(**kwargs).longest_name()} of model.hf_config={kwargs['config']!r}"

    def builtin_config(self, seq_len: int) -> Optional[ModelConfig]:
        """The built-in shapes of a config whose counted module has the built-in decoder's matrices (Llama, Mistral,
        Qwen2, Qwen3 and the like: scaling.model.hf.builtin_shapes); None for any other, or a file that overrides
        its matrices' shapes in a way the sizes do not say."""
        from scaling.model.hf.builtin_shapes import builtin_config
        from scaling.model.hf.config import read_config

        text = read_config(**self.config.kwargs).text
        return builtin_config(self.config.name, text, self.counted(seq_len))

    def shape(self, seq_len: int) -> ModelShape:
        """A config the built-in formulas describe, as the step model sees the built-in decoder of its shapes (its
        vectors, a few thousand elements a block, left out); any other, its counted tensors."""
        builtin = self.builtin_config(seq_len)
        if builtin is None:
            return super().shape(seq_len)
        from scaling.model.llama.args import param_shapes

        return ModelShape.cached(self.config.name, param_shapes(builtin), builtin.n_layers)

    def as_on_real_tensors(self) -> ContextManager[None]:
        """transformers' masks on fake tensors as on real ones: SDPA with is_causal and no mask, key/value heads as
        they are (scaling.model.hf.causal_lm.masks_as_on_real_tensors)."""
        from scaling.model.hf.causal_lm import masks_as_on_real_tensors

        return masks_as_on_real_tensors()

    def attention_of(self, module: nn.Module) -> Optional[str]:
        """transformers' choice (said on stderr when it is not SDPA and the file did not ask for it); the module is
        left as built on meta (scaling.model.hf.causal_lm.as_built_on_meta)."""
        from scaling.model.hf.causal_lm import DEFAULT_ATTENTION, as_built_on_meta, attention_of

        as_built_on_meta(module)
        attention = attention_of(module)
        if attention != DEFAULT_ATTENTION and self.config.kwargs.get("attn_implementation") is None:
            label = f"model {self.config.name!r} ({self.config.source})"
            print(
                f"[scaling] {label}: {type(module).__name__} has no SDPA attention in this transformers: it runs "
                f"{attention} (model.attn_implementation chooses)",
                file=sys.stderr,
                flush=True,
            )
        return attention

    def tp_plan(self) -> dict[str, str]:
        """The model file's `tp_plan`, else the config's `base_model_tp_plan` (under the causal LM's base model,
        scaling.model.hf.causal_lm.hf_tp_plan)."""
        from scaling.model.hf.causal_lm import FUSED_PAIR, hf_kept_whole, hf_tp_plan

        if self.config.tp_plan is not None:
            self._refuse_splitting_what_is_kept_whole(hf_kept_whole(**self.config.kwargs))
            return super().tp_plan()
        from scaling.model.custom.build import no_tp_plan

        plan = hf_tp_plan(**self.config.kwargs)
        if plan:
            return plan
        from scaling.core.model_group import ModelError
        from scaling.model.hf.config import read_config

        own = getattr(read_config(**self.config.kwargs).text, "base_model_tp_plan", None) or {}
        if own:
            words = ", ".join(sorted(set(own.values())))
            said = f"model {self.config.name!r} ({self.config.source}): transformers' tensor-parallel plan for it"
            if set(own.values()) <= FUSED_PAIR:  # Phi-3: fused pairs only
                raise ModelError(
                    f"{said} splits with {words} only: every module it splits is in a pair around a fused projection "
                    f"whose output its forward splits apart ({', '.join(sorted(own))}), which this engine keeps whole "
                    "(a split by rows would give each rank whole parts and train another model); use parallel.tp=1"
                )
            raise ModelError(
                f"{said} splits with {words} only, none of which this engine runs: give its file a tp_plan mapping "
                "module-name patterns to colwise or rowwise (docs/own-project.md)"
            )
        raise no_tp_plan(self.config)

    def _refuse_splitting_what_is_kept_whole(self, whole: dict[str, str]) -> None:
        """A plan of the model file's that splits what transformers' own plan keeps whole between a pair (a fused
        gate and up, packed q, k and v, which the forward splits apart after the projection): each rank would get
        whole parts (the gate on one, the up on the other) and train another model, with every shape lining up."""
        import fnmatch

        from scaling.core.model_group import ModelError
        from scaling.model.hf.causal_lm import FUSED_PAIR

        pairs = {kept: word for kept, word in whole.items() if word in FUSED_PAIR}  # not the experts, the embedding
        for pattern, style in (self.config.tp_plan or {}).items():
            for kept, word in pairs.items():
                if fnmatch.fnmatchcase(kept, pattern) or fnmatch.fnmatchcase(pattern, kept):
                    raise ModelError(
                        f"model.tp_plan: {pattern!r} ({style}) splits {kept}, which transformers' own plan for "
                        f"model {self.config.name!r} keeps whole between a pair ({word}): its forward splits that "
                        "output into parts, and a split by rows would give each rank whole parts and train another "
                        "model; leave it out of tp_plan (it then runs whole on every rank)"
                    )

    def tp_widths(self) -> dict[str, int]:
        from scaling.model.hf.causal_lm import hf_widths

        return hf_widths(**self.config.kwargs)
