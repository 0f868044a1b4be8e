"""The registry of model families (scaling.model.family): each kind of model config finds its family, every family
answers the whole spec, and what the driver asks of the built-in one (its shape, its count, its tensor-parallel
check) needs no torch. Pure, but for the last: a fresh interpreter, to see what it imports."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from scaling.core.model_group import CustomModel, ModelConfig, ModelError, model_of
from scaling.model.custom.family import OwnModule
from scaling.model.family import FAMILIES, checked, family_of
from scaling.model.hf.family import HuggingFace
from scaling.model.llama.family import Llama
from scaling.perf.mfu_model import FlopsSplit


@pytest.mark.parametrize(
    "plain, family",
    [
        ({"name": "tiny"}, Llama),
        ({"name": "mine", "_target_": "my_pkg.models.GPT", "vocab_size": 64, "max_seq_len": 32}, OwnModule),
        ({"name": "hf_llama_tiny", "hf_config": "model/hf_llama_tiny.json"}, HuggingFace),
    ],
    ids=["built-in", "own module", "hugging face"],
)
def test_each_kind_of_model_config_finds_its_family(plain, family):
    assert type(family_of(model_of(plain))) is family


def test_every_family_answers_the_whole_spec_and_the_most_specific_claims_first():
    assert not [f.__name__ for f in FAMILIES if inspect.isabstract(f)]
    claiming = [f for f in FAMILIES if f.claims(model_of({"name": "x", "hf_config": "model/hf_llama_tiny.json"}))]
    assert claiming[0] is HuggingFace and OwnModule in claiming  # a Hugging Face config is a module one brings too
    with pytest.raises(ModelError, match="no family builds a dict"):
        family_of({"name": "x"})  # type: ignore[arg-type]


def test_the_built_in_family_counts_and_gives_its_shape_in_closed_form():
    family = family_of(ModelConfig(name="small", n_layers=2, hidden=256, n_heads=4, ffn_hidden=512, vocab_size=1024))
    counted, shape = family.counted(64), family.shape(64)
    assert family.closed_form and counted.source == "closed_form" and shape is family.shape(128)  # one object
    assert sum(t.numel for t in shape.tensors) == counted.n_params and shape.n_blocks == counted.n_blocks == 2
    split = FlopsSplit.of(counted)  # the attention told apart from the matmuls: 12·L·h·seq of the total
    assert split.attention == 12 * 2 * 256 * 64 and split.model == counted.flops_per_token
    assert checked(family.config, 64, tp=2) == counted


def test_a_module_one_brings_without_a_plan_is_refused_tensor_parallelism_naming_the_key():
    own = CustomModel(name="mine", target="my_pkg.models.GPT", kwargs={"vocab_size": 64, "max_seq_len": 32})
    with pytest.raises(ModelError, match="model 'mine' .* has no tensor-parallel plan: give its file a tp_plan"):
        family_of(own).check_tp(2)


@pytest.mark.subprocess
def test_what_the_driver_asks_of_the_built_in_family_imports_no_torch():
    script = (
        "import sys\n"
        "from scaling.core.model_group import ModelConfig\n"
        "from scaling.model.family import checked, family_of\n"
        "family = family_of(ModelConfig())\n"
        "checked(family.config, 64, tp=2), family.shape(64)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
