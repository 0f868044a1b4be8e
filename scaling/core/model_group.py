"""The `model` config group's two kinds, as the schema composes them: the built-in decoder family (ModelConfig) and a
model the user brings (CustomModel: their module by `_target_`, or a Hugging Face config by `hf_config`); `model_of`
reads either from its plain form. Standard library only. Everything else about a model (its module, builder, FLOPs,
shape and contract check) is its family's in scaling.model (scaling.model.family picks it)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Protocol, Union

from scaling.core.field_meta import COLUMN, NEUTRAL
from scaling.core.files import config_dirs


class ModelError(ValueError):
    """A model that cannot be used: one line naming the field, the value and what would be valid."""


class Checks(Protocol):
    """What a model config checks itself with (scaling.core.validate's checker: it collects every problem)."""

    def require(self, ok: bool, message: str) -> bool: ...

    def positive(self, name: str, value: Any, *, allow_none: bool = False, integer: bool = True) -> bool: ...


@dataclass
class ModelConfig:
    """A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

    name: str = field(default="tiny", metadata={COLUMN: "model"})
    """Preset name, carried into records and plots ."""
    n_layers: int = 2
    """Number of decoder blocks (L)."""
    hidden: int = 64
    """Model width (h)."""
    n_heads: int = 4
    """Attention query heads; must divide `hidden` unless `head_dim` is given."""
    n_kv_heads: int = 2
    """Key/value heads (GQA); must divide `n_heads`."""
    ffn_hidden: int = 192
    """Inner width of the SwiGLU MLP."""
    vocab_size: int = 512
    """Vocabulary size (v)."""
    max_seq_len: int = 512
    """Longest sequence the model is configured for; `train.seq_len` may not exceed it."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share the token embedding with the output projection (Llama 3.2 1B/3B do)."""
    head_dim: Optional[int] = field(default=None, metadata={NEUTRAL: None})
    """Width of one attention head; None: hidden / n_heads. Given, the query and output projections are
    n_heads·head_dim wide, whatever `hidden` (Gemma 2 and 3, Qwen3-0.6B and 4B)."""

    def __post_init__(self) -> None:
        # a head_dim of hidden / n_heads is the default's model: one form of it, one job key (not measured twice)
        h, heads, d = self.hidden, self.n_heads, self.head_dim
        if all(type(v) is int for v in (h, heads, d)) and heads > 0 and h % heads == 0 and d == h // heads:
            self.head_dim = None

    def to_dict(self) -> dict[str, Any]:
        """The model as its file says it (the record's `config.model`)."""
        return asdict(self)

    @property
    def hd(self) -> int:
        """The width of one attention head: `head_dim`, else hidden / n_heads."""
        return self.head_dim or self.hidden // self.n_heads

    @property
    def q_dim(self) -> int:
        """The attention's width: the query projection's output and the output projection's input (n_heads·hd)."""
        return self.n_heads * self.hd

    @property
    def grouped_query(self) -> bool:
        """Whether its attention is grouped-query (fewer key/value heads than query heads): the kernels that run it."""
        return self.n_kv_heads != self.n_heads

    def check(self, c: Checks) -> None:
        """Its sizes positive, heads dividing the width into an even head_dim (RoPE), key/value heads dividing heads."""
        sizes_ok = all(
            [
                c.positive(f"model.{k}", getattr(self, k))
                for k in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size", "max_seq_len")
            ]
        )
        c.positive("model.rope_theta", self.rope_theta, integer=False)
        c.positive("model.norm_eps", self.norm_eps, integer=False)
        if not sizes_ok:
            return
        h, heads, kv = self.hidden, self.n_heads, self.n_kv_heads
        if self.head_dim is not None:
            if c.positive("model.head_dim", self.head_dim, allow_none=True):
                c.require(
                    self.head_dim % 2 == 0,
                    f"model.head_dim={self.head_dim} is odd: RoPE needs an even head_dim (or null: hidden / n_heads)",
                )
        elif c.require(
            h % heads == 0,
            f"model.n_heads={heads} does not divide model.hidden={h}: try n_heads in "
            f"{{{', '.join(str(d) for d in range(1, h + 1) if h % d == 0 and (h // d) % 2 == 0)}}}, or give "
            "model.head_dim",
        ):
            c.require((h // heads) % 2 == 0, f"model.hidden/n_heads = {h // heads} is odd: RoPE needs an even head_dim")
        c.require(
            heads % kv == 0,
            f"model.n_kv_heads={kv} does not divide model.n_heads={heads}: try n_kv_heads in "
            f"{{{', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)}}}",
        )

    def check_tp(self, c: Checks, tp: int) -> None:
        """Tensor parallelism splits its heads and widths evenly."""
        widths = {"n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads, "ffn_hidden": self.ffn_hidden}
        widths["hidden"] = self.hidden
        split = [f"model.{k}={v}" for k, v in widths.items() if v % tp]
        c.require(
            not split,
            f"parallel.tp={tp} does not divide {', '.join(split)}: tensor parallelism splits heads and widths evenly; "
            f"try tp in {tp_degrees_dividing(widths)}",
        )


TARGET_KEY = "_target_"
"""The key of a model config that names the user's module (a class or factory), as Hydra's `instantiate` spells it."""
HF_KEY = "hf_config"
"""The key of a model config that names a Hugging Face causal LM's config.json (no weights): shorthand for the target
HF_TARGET with the file's path, its vocabulary, its longest sequence and its content hash as arguments."""
HF_TARGET = "scaling.engine.hf_model.causal_lm"
"""The name records give the factory of a Hugging Face causal LM built from its config alone: it is part of their job
keys, so it stays the dotted path the factory first had; scaling.model.custom.build maps it to where the factory lives
now (scaling.model.hf.causal_lm). transformers: `pip install 'scaling[hf]'`."""


TP_STYLES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "embedding", "replicate_sum_grad")
"""A tensor-parallel plan's words: colwise (output sharded: its heads or width split), rowwise (input sharded, output
all-reduced), colwise_rep (colwise, output gathered: a head whose logits every rank needs), rowwise_rep (rowwise),
embedding (an nn.Embedding split along its vocabulary, the ids replicated), replicate_sum_grad (whole on every rank,
its gradients summed over the tp ranks: a norm over each head's width, fed this rank's heads, as Qwen3's q_norm)."""

TP_DEGREES = (1, 2, 4, 8)
"""Tensor-parallel degrees within a node of 8 GPUs: those a refusal suggests and the recipe weighs."""


def tp_degrees_dividing(widths: Mapping[str, int]) -> str:
    """`{1, 2}`: the degrees of TP_DEGREES that split each of a model's heads and widths evenly."""
    return "{" + ", ".join(str(d) for d in TP_DEGREES if all(v % d == 0 for v in widths.values())) + "}"


@dataclass
class CustomModel:
    """A model the user brings: their own `nn.Module` (`_target_`: a class or a factory, imported from their project).
    Every other key of the file but `name` and `blocks` is a keyword argument of the target; the data and the
    validation need `vocab_size` and `max_seq_len` among them."""

    name: str = field(default="custom", metadata={COLUMN: "model"})
    target: Optional[str] = None
    """Dotted path of the class or factory (`my_pkg.models.GPT`); the file's `_target_`."""
    blocks: Optional[str] = None
    """Dotted path of the block class to shard and recompute; null: found (the class of the repeated children of the
    module's largest nn.ModuleList)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The target's keyword arguments."""
    tp_plan: Optional[dict[str, str]] = None
    """Tensor parallelism (parallel.tp > 1): module-name patterns (`layers.*.attn.q`, fnmatch) -> colwise |
    rowwise | colwise_rep | rowwise_rep | embedding | replicate_sum_grad (TP_STYLES); null: no plan (a Hugging Face config brings its own)."""

    grouped_query = False
    """Its attention is its own: what runs it is the model's choice."""

    @property
    def source(self) -> str:
        """What builds it, as messages and the record's `derived.model.source` name it: the target's dotted path, or
        for a Hugging Face config its file (HF_TARGET is a name records keep, not a module that exists)."""
        return f"hf_config={self.kwargs.get('config')}" if self.target == HF_TARGET else str(self.target)

    def check(self, c: Checks) -> None:
        """What the driver can check without torch: a dotted target, and the sizes the data needs (the rest is checked
        on fake tensors by its family: scaling.model.custom.count)."""
        c.require(
            isinstance(self.target, str) and "." in self.target,
            f"model._target_={self.target!r} must be a dotted path to a class or factory, e.g. my_pkg.models.GPT",
        )
        for key in ("vocab_size", "max_seq_len"):
            if self.target == HF_TARGET and self.kwargs.get(key) is None:
                continue  # a Hugging Face config's own name for it (n_positions) is read through transformers
            if c.require(
                key in self.kwargs,
                f"model.{key} is missing: a model's _target_ ({self.target}) takes vocab_size and max_seq_len among "
                "its keyword arguments (the data and the validation need both)",
            ):
                c.positive(f"model.{key}", self.kwargs[key])

    def check_tp(self, c: Checks, tp: int) -> None:
        """Tensor parallelism needs a plan (its file's `tp_plan`, or a Hugging Face config's own) in the plan's words."""
        c.require(
            self.tp_plan is not None or self.target == HF_TARGET,
            f"parallel.tp={tp}: model {self.name!r} ({self.source}) has no tensor-parallel plan: give its file a "
            "tp_plan mapping module-name patterns to colwise or rowwise (docs/own-project.md), or leave tp at 1",
        )
        bad = {k: v for k, v in (self.tp_plan or {}).items() if v not in TP_STYLES}
        c.require(
            not bad,
            f"model.tp_plan: {', '.join(f'{k}: {v!r}' for k, v in bad.items())}: a style is one of {', '.join(TP_STYLES)}",
        )

    @property
    def vocab_size(self) -> Any:
        """The vocabulary the data draws tokens from."""
        return self.kwargs.get("vocab_size")

    @property
    def max_seq_len(self) -> Any:
        """The longest sequence the model takes."""
        return self.kwargs.get("max_seq_len")

    def to_dict(self) -> dict[str, Any]:
        """The model as its file says it (the record's `config.model`)."""
        out: dict[str, Any] = {"name": self.name, TARGET_KEY: self.target}
        if self.blocks is not None:
            out["blocks"] = self.blocks
        if self.tp_plan is not None:
            out["tp_plan"] = dict(self.tp_plan)
        return {**out, **self.kwargs}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> CustomModel:
        """The model of a file (or a record's `config.model`) that has `_target_`, or `hf_config` (expanded to
        HF_TARGET's arguments: the path, `vocab_size` and `max_seq_len` from the file unless given, its hash)."""
        if HF_KEY in values and TARGET_KEY not in values:
            values = _hf_arguments(values)
        own = {"name", TARGET_KEY, "blocks", "tp_plan"}
        plan = values.get("tp_plan")
        return cls(
            name=values.get("name", cls.name),
            target=values.get(TARGET_KEY),
            blocks=values.get("blocks"),
            kwargs={k: v for k, v in values.items() if k not in own},
            tp_plan=None if plan is None else {str(k): str(v) for k, v in dict(plan).items()},
        )


def hf_config_dirs() -> list[Path]:
    """Where a relative `hf_config:` is looked for, first match first: the working directory, then where config
    groups are (the project's conf/, then the shipped configs: `model/hf_llama_tiny.json` is scaling.conf's)."""
    return [Path.cwd(), *config_dirs()]


def hf_config_path(given: str) -> Path:
    """A Hugging Face config file: as given where it is absolute or names a file, else the first of hf_config_dirs'
    that holds it (as given where none does: its reader names where it looked)."""
    path = Path(given)
    if path.is_absolute() or path.is_file():
        return path
    return next((d / path for d in hf_config_dirs()[1:] if (d / path).is_file()), path)


def _hf_arguments(values: Mapping[str, Any]) -> dict[str, Any]:
    """A model file's `hf_config: path` as HF_TARGET's arguments; an unreadable file leaves them to the validation
    (vocab_size and max_seq_len missing) and the factory (which names the file)."""
    out = {k: v for k, v in values.items() if k != HF_KEY}
    path = hf_config_path(str(values[HF_KEY]))
    out[TARGET_KEY], out["config"] = HF_TARGET, str(values[HF_KEY])
    try:
        text = path.read_bytes()
        fields = json.loads(text)
    except (OSError, ValueError):
        return out
    if isinstance(fields, dict):
        out.setdefault("vocab_size", fields.get("vocab_size"))
        out.setdefault("max_seq_len", fields.get("max_position_embeddings"))
        out["config_sha256"] = hashlib.sha256(text).hexdigest()[:16]  # an edited file is another model: another key
    return out


ModelGroup = Union[ModelConfig, CustomModel]
"""A `model` config of either kind."""


def is_custom(values: Mapping[str, Any]) -> bool:
    """Whether a model config's plain form is a model the user brings (it names a target or an HF config)."""
    return TARGET_KEY in values or HF_KEY in values


class UnknownKey(TypeError, ValueError):
    """A key a config group lacks (a misspelt model-file key, a `+train.seqlen=64`): one line naming it, what it could
    mean and the group's fields. Raised while the config is built, before any point exists."""


def closest_field(key: str, known: Iterable[str]) -> Optional[str]:
    """The field a misspelt `key` could mean: the nearest spelling (`seqlen`: seq_len), else the field the key begins
    (`zero`: zero_stage); None where no field is near."""
    import difflib

    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return close[0] if close else next((n for n in names if n.startswith(key)), None)


def unknown_key(where: str, key: str, known: set[str], what: str = "") -> UnknownKey:
    """`train.seqlen is not a field of train (did you mean train.seq_len?): its fields are ...`."""
    close = closest_field(key, known)
    mean = f" (did you mean {where}.{close}?)" if close else ""
    return UnknownKey(
        f"{where}.{key} is not a field of {what or where}{mean}: its fields are {', '.join(sorted(known))}"
    )


def model_of(values: Mapping[str, Any]) -> ModelGroup:
    """The typed model config of its plain form (a model file, a record's `config.model`): the kind its keys say."""
    if is_custom(values):
        return CustomModel.from_dict(values)
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        error = unknown_key("model", unknown[0], known | {TARGET_KEY, HF_KEY}, f"the built-in decoder (model "
                            f"{values.get('name')!r})")  # fmt: skip
        raise UnknownKey(f"{error}; a model of your own names its class or factory with _target_, a Hugging Face "
                         "config's file with hf_config")  # fmt: skip
    return ModelConfig(**values)


def model_dict(model: ModelGroup) -> dict[str, Any]:
    """The plain form of either kind of model config."""
    return model.to_dict()


def model_hash(model: ModelGroup) -> str:
    """A short hash of a model config (what the record names it by beside its name: two models of one name differ)."""
    canonical = json.dumps(model_dict(model), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]
