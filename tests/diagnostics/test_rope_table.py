"""Per-pair diagnostics (rope_table.py) and the `llamablock rope` command.

The central test is the module's claim of section 15.2 at L = 4,096, T = 32,768, head width 128
(base 10,000, LLaMA 2's): unscaled, only slow pairs reach unseen angles; interpolation crowds
the fast pairs; NTK leaves some middle pairs overshooting; YaRN leaves none. The thresholds
come from closed forms: a pair is slow when its wavelength 2 pi base^(2i/d) exceeds L.
"""

import json
import math

import matplotlib.image
import pytest

from llamablock.cli import main
from llamablock.diagnostics.rope_table import compare_methods, config_method
from llamablock.presets import preset

L, T, D, BASE = 4096, 32768, 128, 10000.0


@pytest.fixture(scope="module")
def methods():
    return {m["method"]: m for m in compare_methods(L, T, D, BASE)}


def _slow_pairs():  # closed form: wavelength 2 pi base^(2i/d) > L
    return [i for i in range(D // 2) if 2 * math.pi * BASE ** (2 * i / D) > L]


def test_records_match_the_closed_forms(methods):
    pairs = methods["default"]["pairs"]
    assert len(pairs) == D // 2
    for p in pairs:
        theta = BASE ** (-2 * p["pair"] / D)
        assert math.isclose(p["frequency"], theta, rel_tol=1e-6)
        assert math.isclose(p["wavelength"], 2 * math.pi / theta, rel_tol=1e-6)
        assert math.isclose(p["rotations_in_training"], L * theta / (2 * math.pi), rel_tol=1e-6)
        assert p["interpolation_ratio"] == 1.0
    assert all(math.isclose(p["interpolation_ratio"], T / L, rel_tol=1e-6) for p in methods["linear"]["pairs"])


def test_module_claim_only_slow_pairs_reach_unseen_angles_unscaled(methods):
    slow = _slow_pairs()
    assert methods["default"]["unseen_pairs"] == slow and 0 < len(slow) < D // 2
    assert methods["default"]["crowded_pairs"] == []


def test_module_claim_interpolation_crowds_the_fast_pairs(methods):
    fast = [i for i in range(D // 2) if i not in _slow_pairs()]
    assert methods["linear"]["unseen_pairs"] == []
    assert methods["linear"]["crowded_pairs"] == fast  # every pair that had turned, the fastest by the full 8x
    for name in ("ntk", "yarn", "llama3"):  # the others leave the fastest pair alone
        assert methods[name]["pairs"][0]["interpolation_ratio"] == 1.0


def test_module_claim_ntk_leaves_middle_pairs_overshooting(methods):
    unseen = methods["ntk"]["unseen_pairs"]
    assert unseen and set(unseen) < set(_slow_pairs())
    assert D // 2 - 1 not in unseen  # the slowest pair is interpolated by exactly s, by construction
    for i in unseen:  # overshoot: the pair's ratio is below T / L, so T/ratio > L
        assert methods["ntk"]["pairs"][i]["target_in_trained_tokens"] > L * 1.001


def test_module_claim_yarn_and_llama3_leave_none(methods):
    assert methods["yarn"]["unseen_pairs"] == [] and methods["llama3"]["unseen_pairs"] == []
    assert methods["dynamic"]["unseen_pairs"] == []
    assert math.isclose(methods["yarn"]["attention_factor"], 0.1 * math.log(T / L) + 1, rel_tol=1e-9)


def test_config_method_uses_the_configs_own_scaling():
    cfg = preset("llama-3.1-8b")  # llama3 rule, factor 8, original 8192
    rec = config_method(cfg, 8192, 65536)
    assert rec["rope_scaling"]["rope_type"] == "llama3" and rec["unseen_pairs"] == []
    assert max(p["interpolation_ratio"] for p in rec["pairs"]) == pytest.approx(8.0, rel=1e-6)


def test_compare_methods_rejects_bad_lengths():
    with pytest.raises(ValueError, match="train_len <= target_len"):
        compare_methods(8192, 4096, 128)


def test_cli_table_json_and_plot(tmp_path, capsys):
    out_png = tmp_path / "rope.png"
    assert main(["rope", "--plot", str(out_png)]) == 0
    text = capsys.readouterr().out
    assert "unseen pairs: 46-63 (18)" in text and "plot written" in text
    img = matplotlib.image.imread(out_png)
    assert img.shape[0] > 300 and img.shape[1] > 500 and img[..., :3].std() > 0.05  # a drawn figure, not blank
    assert main(["rope", "--json", "--config", "llama-3.1-8b", "--target-len", "65536"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["train_len"] == 8192 and res["head_dim"] == 128 and res["base"] == 500000.0
    assert [m["method"] for m in res["methods"]][-1] == "config"
    assert all(len(m["pairs"]) == 64 for m in res["methods"])


def test_cli_reads_a_transformers_config_json(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen2", "vocab_size": 16, "hidden_size": 256, "num_attention_heads": 2,
                                "num_hidden_layers": 1, "intermediate_size": 8, "max_position_embeddings": 32768,
                                "rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                    "original_max_position_embeddings": 32768}}))
    assert main(["rope", "--config", str(path), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["train_len"] == 32768 and res["target_len"] == 8 * 32768 and res["base"] == 1e6


def test_cli_non_rope_configs_have_no_pairs_and_alibi_shows_its_slopes(tmp_path, capsys):
    assert main(["rope", "--config", "gpt-2017-small"]) == 0  # learned positions
    assert "no rotary pairs" in capsys.readouterr().out
    path = tmp_path / "alibi.json"
    path.write_text(json.dumps(preset("llama-2024-small", position="alibi").to_dict()))
    assert main(["rope", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    # Press et al. 2022: slopes 2^(-8k/n), k = 1..n; n = 8 heads here
    assert "ALiBi" in out and ", ".join(f"{2 ** (-8 * k / 8):.4g}" for k in range(1, 9)) in out


@pytest.mark.parametrize("argv,msg", [
    (["rope", "--train-len", "8192", "--target-len", "4096"], "--target-len (4096) must be at least --train-len"),
    (["rope", "--head-dim", "63"], "--head-dim must be an even width"),
    (["rope", "--base", "-5"], "--base must be a number above 1"),
    (["rope", "--config", "no-such-model"], "neither a preset"),
    (["rope", "--plot", "out.svg"], "needs a .png"),
    # each of these was a traceback (ZeroDivisionError, OverflowError) or a SIGABRT
    (["rope", "--base", "inf"], "--base must be a number above 1"),
    (["rope", "--base", "1e-300"], "--base must be a number above 1"),
    (["rope", "--base", "1e300"], "at most 1e+18"),
    (["rope", "--base", "nan"], "--base must be a number above 1"),
    (["rope", "--head-dim", str(10**8)], "--head-dim must be an even width in 4..65,536"),
    (["rope", "--target-len", "1" + "0" * 399], "--target-len must be a number of tokens in 1..1,073,741,824, got a "
                                                "400-digit number"),
    (["rope", "--train-len", "0"], "--train-len must be a number of tokens"),
])
def test_cli_bad_input_is_one_clear_line(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_cli_reads_the_rope_fields_of_a_family_it_cannot_run(tmp_path, capsys):
    # Phi-3.5-MoE's longrope: original length at the top level, factor from 131072 / 4096 = 32
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "phimoe", "hidden_size": 3072, "num_attention_heads": 32,
                                "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                                "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48,
                                                 "long_factor": [32.0] * 48}}))
    assert main(["rope", "--config", str(path), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    own = res["methods"][-1]
    assert res["train_len"] == 4096 and res["target_len"] == 131072 and own["method"] == "config"
    # LongRoPE's attention factor sqrt(1 + ln 32 / ln 4096); every pair divided by its long factor 32
    assert own["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert all(p["interpolation_ratio"] == pytest.approx(32.0) for p in own["pairs"]) and own["unseen_pairs"] == []
