"""`llamablock rope lint`: every rule fires on a config with its trap and stays silent on the
published configs of Llama 3.1, Qwen2.5 with YaRN, and Mistral. Where a trap is a claim about
what transformers does, the test checks that claim against transformers itself."""

import copy
import json
import math

import pytest
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from llamablock.cli import main
from llamablock.diagnostics.rope_lint import lint_config, lint_file

# meta-llama/Llama-3.1-8B, config.json on the Hugging Face Hub (v4 form, transformers 4.43)
LLAMA_31 = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}
# Qwen/Qwen2.5-7B-Instruct config.json with the rope_scaling block its model card says to add for
# texts over 32,768 tokens ("Processing Long Texts", YaRN)
QWEN25_YARN = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 152064,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}
# mistralai/Mistral-7B-v0.1, config.json on the Hub
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000,
}
PUBLISHED = {"llama-3.1": LLAMA_31, "qwen2.5-yarn": QWEN25_YARN, "mistral-7b": MISTRAL_7B}


def _with(base, **scaling_changes):
    d = copy.deepcopy(base)
    for k, v in scaling_changes.items():
        if v is None:
            d["rope_scaling"].pop(k)
        else:
            d["rope_scaling"][k] = v
    return d


def _v5(d):  # the same config as transformers 5 saves it: rope_parameters, no rope_scaling
    d = copy.deepcopy(d)
    d["rope_parameters"] = {"rope_theta": d.pop("rope_theta"), **d.pop("rope_scaling")}
    d["rope_parameters"]["rope_type"] = d["rope_parameters"].pop("type", d["rope_parameters"].get("rope_type"))
    return d


DEEPSEEK_LIKE = _with(QWEN25_YARN, mscale=1.0, mscale_all_dim=1.0)
TRAPS = {
    "ignored-type": [_with(LLAMA_31, rope_type=None), _with(LLAMA_31, rope_type="default"),
                     _with(QWEN25_YARN, type="ntk"), _with(QWEN25_YARN, type="su")],
    "mscale-cancels": [DEEPSEEK_LIKE],
    "missing-original": [_with(LLAMA_31, original_max_position_embeddings=None),
                         _with(QWEN25_YARN, original_max_position_embeddings=None)],
    "original-conflict": [{**QWEN25_YARN, "original_max_position_embeddings": 8192}],
    "factor-overridden": [{**_with(QWEN25_YARN), "max_position_embeddings": 65536}],
    "equal-freq-factors": [_with(LLAMA_31, high_freq_factor=1.0)],
    "odd-rotary-width": [{**MISTRAL_7B, "head_dim": 126, "partial_rotary_factor": 0.5}],
    "forms-disagree": [{**LLAMA_31, "rope_parameters": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                                                        "high_freq_factor": 4.0, "rope_theta": 500000.0,
                                                        "original_max_position_embeddings": 8192}}],
    "factor-below-one": [_with(QWEN25_YARN, factor=0.5)],
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_silent_on_published_configs_in_both_forms(name):
    assert lint_config(PUBLISHED[name]) == []
    assert lint_config(_v5(PUBLISHED[name]) if "rope_scaling" in PUBLISHED[name] else PUBLISHED[name]) == []
    both = {**PUBLISHED[name], **_v5(PUBLISHED[name])} if "rope_scaling" in PUBLISHED[name] else None
    if both is not None:  # both forms present but saying the same thing: not a trap
        assert lint_config(both) == []


@pytest.mark.parametrize("rule,config", [(r, c) for r, cs in TRAPS.items() for c in cs])
def test_each_rule_fires_on_its_trap(rule, config):
    warnings = lint_config(config)
    assert rule in [w.rule for w in warnings]
    w = next(w for w in warnings if w.rule == rule)
    assert "\n" not in w.message and len(w.message) > 40  # one line, says what happens and what to write


def test_the_traps_are_real_in_transformers():
    def rope(d):
        cfg = transformers.AutoConfig.for_model(**copy.deepcopy(d))
        kind = cfg.rope_parameters["rope_type"]
        return kind, (ROPE_INIT_FUNCTIONS[kind](cfg, "cpu") if kind != "default" else None), cfg

    # ignored-type: a factor without a type loads as plain RoPE
    assert rope(_with(LLAMA_31, rope_type=None))[0] == "default"
    # mscale-cancels: the attention factor is exactly 1, not 0.1 ln 4 + 1
    assert rope(DEEPSEEK_LIKE)[1][1] == 1.0 and rope(QWEN25_YARN)[1][1] == pytest.approx(0.1 * math.log(4) + 1)
    # missing-original: the extended length 131072 is taken as the trained one
    cfg = rope(_with(LLAMA_31, original_max_position_embeddings=None))[2]
    assert cfg.rope_parameters["original_max_position_embeddings"] == 131072
    # original-conflict: the rotary embedding's init re-standardizes and takes the top-level 8192
    assert rope(TRAPS["original-conflict"][0])[2].rope_parameters["original_max_position_embeddings"] == 8192
    # forms-disagree: rope_scaling wins
    assert rope(TRAPS["forms-disagree"][0])[2].rope_parameters["factor"] == 8.0


def test_cli_lint_exit_status_and_output(tmp_path, capsys):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(LLAMA_31))
    bad.write_text(json.dumps(DEEPSEEK_LIKE))
    assert main(["rope", "lint", str(good)]) == 0
    assert "no RoPE problems" in capsys.readouterr().out
    assert main(["rope", "lint", str(bad)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{bad}: mscale-cancels: ")
    assert main(["rope", "lint", "--json", str(bad)]) == 1
    assert json.loads(capsys.readouterr().out)[0]["rule"] == "mscale-cancels"


def test_lint_bad_files_are_clear_errors(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        lint_file(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["rope", "lint", str(broken)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_phi3_top_level_original_length_is_read_by_its_config_and_not_flagged():
    phi3 = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}}
    assert transformers.AutoConfig.for_model(**copy.deepcopy(phi3)).rope_parameters[
        "original_max_position_embeddings"] == 4096
    assert lint_config(phi3) == []
