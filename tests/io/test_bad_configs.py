"""Loader inputs that ended in tracebacks, hung, grew memory without bound or were silently
accepted: each is now a clear ValueError naming the field (one line at the command line), checked
before any module is built. Named regression tests, then a property test over mutated configs."""

from __future__ import annotations

import json
import math

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_config, tiny_hf_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llamablock
from llamablock import ModelConfig


def _valid() -> dict:
    return tiny_hf_config("llama").to_dict()


@pytest.mark.parametrize("key,value,message", [
    ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false"),
    ("num_attention_heads", 0, "num_attention_heads must be positive"),
    ("hidden_size", "32", "hidden_size must be an integer"),
    ("num_hidden_layers", 2.0, "num_hidden_layers must be an integer"),
    ("rope_theta", math.inf, "rope_theta must be a finite number"),
    ("rope_scaling", "linear", "rope_scaling must be a JSON object or null"),
    ("rms_norm_eps", math.nan, "rms_norm_eps must be a finite number"),
])
def test_bad_fields_are_named(key, value, message):
    hf = {**_valid(), key: value}
    hf.pop("rope_parameters", None) if key == "rope_theta" else None
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


def test_a_missing_shape_field_is_named():
    hf = _valid()
    del hf["intermediate_size"]
    with pytest.raises(ValueError, match="config.json lacks 'intermediate_size'"):
        ModelConfig.from_hf(hf)


def test_a_config_that_lies_about_its_layers_is_refused_before_building(tmp_path):
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1_000_000}))
    with pytest.raises(ValueError, match="num_hidden_layers = 1000000, the checkpoint holds 2 layers"):
        llamablock.load_pretrained(tmp_path)


def test_a_gguf_that_lies_about_its_blocks_is_refused(tmp_path):
    f = tmp_path / "lie.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2), extra_kv={"llama.block_count": 1_000_000_000})
    with pytest.raises(ValueError, match="block_count = 1000000000, the file holds tensors for 2 blocks"):
        llamablock.load_pretrained(f)


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                        st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted(_valid())), JSON_VALUES, max_size=4), st.sets(st.sampled_from(sorted(_valid())), max_size=3))
def test_any_mutated_config_is_a_config_or_a_clear_error(changes, removed):
    """Fuzz: replace and remove fields of a valid config.json; from_hf must return a ModelConfig or
    raise ValueError (the command line's one line), never another exception."""
    hf = {k: v for k, v in {**_valid(), **changes}.items() if k not in removed}
    try:
        cfg = ModelConfig.from_hf(hf)
    except ValueError:
        return
    assert cfg.n_layers > 0 and cfg.head_dim > 0 and math.isfinite(cfg.rope_theta)


def test_a_corrupt_tokenizer_json_is_named(tmp_path):
    from llamablock.io.tokenizer import tokenizer_from_dir

    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')
    with pytest.raises(ValueError, match="is not a readable tokenizer.json"):
        tokenizer_from_dir(tmp_path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "fifo.safetensors", "missing.safetensors"])
def test_index_shards_stay_inside_and_are_files(tmp_path, shard):
    """A shard path leaving the directory, or a FIFO (which hung the loader), is refused by name."""
    import os

    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path / "m")
    (tmp_path / "outside.safetensors").write_bytes(b"")
    os.mkfifo(tmp_path / "m" / "fifo.safetensors")
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": shard}}))
    with pytest.raises(ValueError, match="which is not a file inside"):
        llamablock.load_pretrained(tmp_path / "m")


def test_a_bad_index_is_named(tmp_path):
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a safetensors index"):
        llamablock.load_pretrained(tmp_path)


def test_templates_may_ask_for_the_date():
    """Llama 3's template calls strftime_now, which transformers provides; it failed here."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    from llamablock.io.tokenizer import Tokenizer

    tok = Tokenizer(Backend(models.BPE({"a": 0}, [])), None, [], None, False, "{{ strftime_now('%Y') }}")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).isdigit()


def test_a_template_that_never_ends_is_stopped():
    """Nested loops over range() hung the loader: the render now stops after a step budget."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    from llamablock.io.tokenizer import Tokenizer

    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    tok = Tokenizer(Backend(models.BPE({"a": 0}, [])), None, [], None, False, loop)
    with pytest.raises(ValueError, match="chat template failed: .*ran past"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_nan_weights_are_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"][3, 3] = float("nan")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="layers.1.ffn.w_up.weight holds non-finite values"):
        llamablock.load_pretrained(tmp_path)


def test_a_gguf_with_zero_key_length_is_named(tmp_path):
    f = tmp_path / "zero.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2), extra_kv={"llama.attention.key_length": 0})
    with pytest.raises(ValueError, match="key_length must be positive, got 0"):
        llamablock.load_pretrained(f)


def test_an_unknown_dtype_label_is_named(tmp_path):
    from llamablock.fast.native import hf_dtype

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": 5}))
    with pytest.raises(ValueError, match="torch_dtype must be one of"):
        hf_dtype(tmp_path)
