"""Loader inputs that ended in tracebacks, hung, grew memory without bound or were silently
accepted: each is now a clear ValueError naming the field (one line at the command line), checked
before any module is built. Named regression tests, then a property test over mutated configs,
then a table of damaged files (tokenizer, generation and model configs, state.json, weights, GGUF
metadata) through the command line: each refused in one line naming the file and the field."""

from __future__ import annotations

import json
import math

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_config, tiny_hf_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llamablock
from llamablock.io.hf_config import config_from_file, config_from_hf


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
        config_from_hf(hf)


def test_a_missing_shape_field_is_named():
    hf = _valid()
    del hf["intermediate_size"]
    with pytest.raises(ValueError, match="config.json lacks 'intermediate_size'"):
        config_from_hf(hf)


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
        cfg = config_from_hf(hf)
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
    from llamablock.fast.formats import dir_format

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": 5}))
    with pytest.raises(ValueError, match="torch_dtype must be one of"):
        dir_format(5, str(tmp_path / "config.json"))


# -- through the command line: each message names the file and the field ------------------------

@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A tiny trained run, its transformers and llamablock exports, and a GGUF maker."""
    from llamablock.io.export import export_run
    from llamablock.presets import preset
    from llamablock.training.train import TrainConfig, train

    root = tmp_path_factory.mktemp("sources")
    train(preset("llama-2024-small", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=32),
          TrainConfig(steps=2, batch_size=2, context=16, warmup=1, eval_every=2, eval_windows=2), root / "run",
          progress=False)
    export_run(root / "run", root / "hf", "hf")
    export_run(root / "run", root / "lb", "llamablock")
    return root


def _edit(f, change):
    d = json.loads(f.read_text())
    change(d)
    f.write_text(json.dumps(d))


def _state(run):
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text() / "state.json"


def _every_state(run, change):
    for f in (run / "checkpoints").glob("step-*/state.json"):
        _edit(f, change)


def _gguf(kv):
    def make(d):
        model = tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64)
        write_tiny_gguf(d / "m.gguf", model, extra_kv=kv)
    return make


TOK, GEN = "tokenizer_config.json", "generation_config.json"
CLI_CASES = [  # id, source, damage (of a copy), command, what the one line must name; comment: what it was
    ("eos-token-a-number", "hf", lambda d: _edit(d / TOK, lambda c: c.update(eos_token=5)), "plain",
     [TOK, "eos_token"]),  # a traceback from the tokenizers library
    ("add-bos-token-a-string", "hf", lambda d: _edit(d / TOK, lambda c: c.update(add_bos_token="false")), "plain",
     [TOK, "add_bos_token"]),  # "false" taken as true
    ("chat-template-a-number", "hf", lambda d: _edit(d / TOK, lambda c: c.update(chat_template=5)), "chat",
     [TOK, "chat_template must be a string"]),  # "this model has no chat template"
    ("chat-templates-without-default", "hf",
     lambda d: _edit(d / TOK, lambda c: c.update(chat_template=[{"name": "tool_use", "template": "x"}])), "chat",
     [TOK, "'default'"]),  # "this model has no chat template"
    ("chat-template-syntax-error", "hf", lambda d: _edit(d / TOK, lambda c: c.update(chat_template="{% for %}")),
     "chat", [TOK, "chat_template", "TemplateSyntaxError"]),  # named no file
    ("chat-template-jinja-not-utf8", "hf", lambda d: (_edit(d / TOK, lambda c: c.pop("chat_template")),
                                                      (d / "chat_template.jinja").write_bytes(b"\xff{{ x }}")),
     "chat", ["chat_template.jinja", "UTF-8"]),  # the codec's bare message
    ("generation-temperature-a-string", "hf", lambda d: _edit(d / GEN, lambda c: c.update(do_sample=True,
                                                                                           temperature="hot")),
     "plain", [GEN, "temperature"]),  # "could not convert string to float: 'hot'"
    ("generation-temperature-nan", "hf", lambda d: (d / GEN).write_text('{"do_sample": true, "temperature": NaN}'),
     "plain", [GEN, "temperature"]),  # named no file
    ("generation-top-k-a-string", "hf", lambda d: _edit(d / GEN, lambda c: c.update(do_sample=True, top_k="x")),
     "plain", [GEN, "top_k"]),  # "invalid literal for int() with base 10: 'x'"
    ("generation-repetition-penalty-a-string", "hf", lambda d: _edit(d / GEN, lambda c: c.update(
        repetition_penalty="x")), "plain", [GEN, "repetition_penalty"]),  # "could not convert string to float"
    ("generation-do-sample-a-string", "hf", lambda d: _edit(d / GEN, lambda c: c.update(do_sample="no")), "plain",
     [GEN, "do_sample"]),  # "no" taken as true
    ("generation-config-a-list", "hf", lambda d: (d / GEN).write_text("[1]"), "plain",
     [GEN, "JSON object"]),  # silently ignored
    ("config-json-not-json", "hf", lambda d: (d / "config.json").write_text("{"), "plain",
     ["config.json", "not valid JSON"]),  # the decoder's bare message
    ("config-json-not-utf8", "hf", lambda d: (d / "config.json").write_bytes(b"\xff\xfe{}"), "plain",
     ["config.json", "UTF-8"]),  # the codec's bare message
    ("llamablock-config-a-number", "lb", lambda d: (d / "config.json").write_text("32"), "plain",
     ["config.json", "JSON object"]),  # a traceback (TypeError)
    ("llamablock-config-without-d-model", "lb", lambda d: _edit(d / "config.json", lambda c: c.pop("d_model")),
     "plain", ["config.json", "lacks 'd_model'"]),  # a traceback (TypeError)
    ("llamablock-weights-not-safetensors", "lb", lambda d: (d / "model.safetensors").write_bytes(b"garbage"),
     "plain", ["model.safetensors", "not a readable safetensors"]),  # a traceback (SafetensorError)
    ("llamablock-weights-of-another-shape", "lb", lambda d: _edit(d / "config.json", lambda c: c.update(d_ff=128)),
     "plain", ["model.safetensors", "config.json", "holds layers.0.ffn.w_gate.weight as (64, 32)"]),  # a traceback
    ("state-json-not-json", "run", lambda d: _state(d).write_text("{"), "plain",
     ["state.json", "not valid JSON"]),  # the decoder's bare message
    ("state-json-a-list", "run", lambda d: _state(d).write_text("[]"), "plain",
     ["state.json", "JSON object"]),  # a traceback (TypeError)
    ("state-json-without-tokenizer", "run", lambda d: _edit(_state(d), lambda s: s.pop("tokenizer")), "plain",
     ["state.json", "tokenizer"]),  # a traceback (KeyError)
    ("state-json-tokenizer-chars-a-number", "run", lambda d: _edit(_state(d), lambda s: s["tokenizer"].update(
        chars=5)), "plain", ["state.json", "'chars'"]),  # a traceback (TypeError)
    ("state-json-unknown-tokenizer-kind", "run", lambda d: _edit(_state(d), lambda s: s["tokenizer"].update(
        kind="weird")), "plain", ["state.json", "kind 'weird'"]),  # named no file
    ("state-json-model-config-without-d-model", "run", lambda d: _edit(_state(d), lambda s: s["model_config"].pop(
        "d_model")), "plain", ["state.json", "model_config lacks 'd_model'"]),  # a traceback (TypeError)
    ("checkpoint-weights-truncated", "run", lambda d: (_state(d).parent / "model.safetensors").write_bytes(
        (_state(d).parent / "model.safetensors").read_bytes()[:500]), "plain",
     ["model.safetensors", "truncated"]),  # a traceback (SafetensorError)
    ("latest-empty", "run", lambda d: (d / "checkpoints" / "latest").write_text(""), "plain",
     ["checkpoints/latest", "is empty", "step-000002"]),  # "latest names checkpoints, which is incomplete"
    ("resume-train-config-unknown-field", "run", lambda d: _every_state(d, lambda s: s["train_config"].update(
        bogus=1)), "resume", ["state.json", "train_config", "bogus"]),  # a traceback (TypeError)
    ("resume-train-config-lr-a-string", "run", lambda d: _every_state(d, lambda s: s["train_config"].update(
        lr="fast")), "resume", ["state.json", "train_config", "lr"]),  # a traceback (TypeError)
    ("resume-history-damaged", "run", lambda d: _every_state(d, lambda s: s.update(history=[1])), "resume",
     ["state.json", "history[0]"]),  # a traceback after training, in the plot
    ("resume-optimizer-groups-damaged", "run", lambda d: _every_state(d, lambda s: s["optimizer"].update(
        param_groups=5)), "resume", ["state.json", "optimizer.param_groups"]),  # a traceback (TypeError)
    ("export-state-json-without-tokenizer", "run", lambda d: _edit(_state(d), lambda s: s.pop("tokenizer")),
     "export", ["state.json", "tokenizer"]),  # a traceback (KeyError)
    ("export-out-an-existing-file", "run", lambda d: (d.parent / "out").write_text("x"), "export",
     ["OUT", "existing file"]),  # "[Errno 20] Not a directory: PosixPath(...)"
    ("gguf-unknown-pre-tokenizer", "gguf", _gguf({"tokenizer.ggml.pre": "martian"}), "plain",
     ["m.gguf", "tokenizer.ggml.pre"]),  # named no file
    ("gguf-eos-id-a-string", "gguf", _gguf({"tokenizer.ggml.eot_token_id": "x"}), "plain",
     ["m.gguf", "tokenizer.ggml.eot_token_id"]),  # "invalid literal for int() with base 10: 'x'"
    ("gguf-chat-template-a-number", "gguf", _gguf({"tokenizer.chat_template": 5}), "chat",
     ["m.gguf", "tokenizer.chat_template must be a string"]),  # a traceback (TypeError)
    ("gguf-chat-template-type-error", "gguf", _gguf({"tokenizer.chat_template": "{{ messages + 1 }}"}), "chat",
     ["m.gguf", "tokenizer.chat_template", "TypeError"]),  # a traceback (TypeError)
]


@pytest.mark.parametrize("source, damage, command, names", [pytest.param(*c[1:], id=c[0]) for c in CLI_CASES])
def test_damaged_inputs_are_one_line_naming_file_and_field(sources, tmp_path, capsys, source, damage, command, names):
    import shutil

    from llamablock import cli

    d = tmp_path / "m"
    shutil.copytree(sources / source, d) if source != "gguf" else d.mkdir()
    damage(d)
    model = str(d / "m.gguf") if source == "gguf" else str(d)
    argv = {"plain": ["generate", "--model", model, "--prompt", "hi", "--max-new-tokens", "2"],
            "chat": ["generate", "--model", model, "--chat", "--prompt", "hi", "--max-new-tokens", "2"],
            "resume": ["train", "--resume", "--out", model, "--steps", "4", "--no-progress"],
            "export": ["export", model, str(tmp_path / "out")]}[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert all(n in err for n in names), err


def test_a_transformers_config_error_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, '
                                          '"num_hidden_layers": 1, "vocab_size": 10}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=f"^{tmp_path}/config.json lacks 'intermediate_size'"):
        llamablock.load_pretrained(tmp_path)


def test_a_binary_config_file_is_named_not_decoded(tmp_path):
    (tmp_path / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="config.json is not UTF-8 text"):
        config_from_file(tmp_path / "config.json")


def test_our_config_lacking_a_field_names_it(tmp_path):
    (tmp_path / "config.json").write_text('{"vocab_size": 10, "n_layers": 1, "n_heads": 2}')
    with pytest.raises(ValueError, match="config.json: config lacks 'd_model'"):
        config_from_file(tmp_path / "config.json")
