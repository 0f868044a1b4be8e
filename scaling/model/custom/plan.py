"""A tensor-parallel plan (a model file's `tp_plan`, or a Hugging Face config's own) checked against the model as
built on the meta device, before any process starts: every pattern names a submodule, and each submodule a style
splits is one it can split (colwise and rowwise split an `nn.Linear`'s weight, embedding an `nn.Embedding`'s). A
refusal is one line naming the pattern and the module names it could have meant. torch and the standard library only.
"""

from __future__ import annotations

import difflib
import fnmatch
import re

from torch import nn

from scaling.core.model_group import ModelError

SPLITS = {
    "colwise": (nn.Linear,),
    "rowwise": (nn.Linear,),
    "colwise_rep": (nn.Linear,),
    "rowwise_rep": (nn.Linear,),
    "embedding": (nn.Embedding,),
}
"""The modules each splitting style takes (torch's ColwiseParallel and RowwiseParallel raise on any other);
`replicate_sum_grad` keeps its module whole and takes any."""


def _general(name: str) -> str:
    """A module name with its list indices as `*`: `model.layers.0.mlp.up_proj` -> `model.layers.*.mlp.up_proj`."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name)


def check_plan(label: str, module: nn.Module, plan: dict[str, str], where: str, every: bool = True) -> None:
    """ModelError, one line, for the first pattern of `plan` (from `where`: `model.tp_plan`, or the config's own)
    that matches no submodule of `module` (naming the closest names it could mean) or matches a module its style
    cannot split. With `every` False (transformers' own plan, which names the modules of every variant of a family:
    Qwen3-MoE's dense MLPs, for its layers that have one) a pattern may match nothing, as transformers lets it, but
    the plan as a whole must match something."""
    modules = {name: m for name, m in module.named_modules() if name}
    general = list(dict.fromkeys(_general(name) for name in modules))
    matches = {p: [name for name in modules if fnmatch.fnmatchcase(name, p)] for p in plan}
    for pattern, word in plan.items():
        matched = matches[pattern]
        if not matched and (every or not any(matches.values())):
            close = difflib.get_close_matches(pattern, general, n=3, cutoff=0.5)
            leaf = pattern.rsplit(".", 1)[-1]
            close = close or [g for g in general if g.rsplit(".", 1)[-1] == leaf][:3] or general[:6]
            raise ModelError(
                f"{where}: {pattern!r} matches no submodule of model {label}; it could mean "
                f"{', '.join(close)} (module names as named_modules() gives them, indices as *)"
            )
        kinds = SPLITS.get(word)
        wrong = [name for name in matched if kinds and not isinstance(modules[name], kinds)]
        if wrong:
            raise ModelError(
                f"{where}: {pattern!r}: {word} splits {' or '.join(k.__name__ for k in kinds)} modules only, and "
                f"{wrong[0]} is a {type(modules[wrong[0]]).__name__}: name its {'/'.join(k.__name__ for k in kinds)} "
                "submodules"
            )
