"""GGUF RoPE scaling (io/gguf_rope.py) against transformers models that declare the same scaling.

Reference: a tiny transformers Llama whose config declares the scaling, written to GGUF as
llama.cpp's converter writes it: linear and yarn as rope.scaling metadata, llama3 as the
rope_freqs tensor of per-pair divisors. The divisors are computed from transformers' own
frequencies (its default inv_freq over its llama3 inv_freq), not from llamablock's. Logits are
compared at 1e-4 (tests/components/test_hf_parity.py's bound) over 512 positions, far enough for the slow
pairs, where the scalings act, to turn; each case also checks that plain RoPE misses that bound
by far, so the comparison can fail.
"""

import numpy as np
import pytest
import torch
import transformers
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock.cli import main
from llamablock.diagnostics.rope_lint import lint_file
from llamablock.fast.compiled.static_decode import StaticDecoder
from llamablock.io.gguf import load_gguf
from llamablock.kv_cache import KVCache

TOL = 1e-4
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


def _hf(scaling: dict | None, theta: float, max_pos: int):
    params = {"rope_theta": theta, **(scaling or {"rope_type": "default"})}
    # head_dim 32: 16 rotary pairs, so that LLaMA 3's band (wavelengths 2048-8192 at base 500,000) holds one
    return tiny_hf_model("llama", n_heads=4, n_kv=2, head_dim=32, max_position_embeddings=max_pos,
                         rope_parameters=params)


def _unscaled(hf):
    """The same transformers model with plain RoPE."""
    plain = _hf(None, hf.config.rope_parameters["rope_theta"], hf.config.max_position_embeddings)
    plain.load_state_dict(hf.state_dict())
    return plain


def _llama3_divisors(hf) -> np.ndarray:
    """rope_freqs as llama.cpp's converter would write it: transformers' default / llama3 inv_freq."""
    inv_llama3 = hf.model.rotary_emb.inv_freq.double()
    d, theta = hf.config.head_dim, hf.config.rope_parameters["rope_theta"]
    inv_default = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    return (inv_default / inv_llama3).float().numpy()


def _write_as_llamacpp_does(tmp_path, hf, scaling: dict):
    """llama3 as the rope_freqs tensor; linear and yarn as rope.scaling metadata."""
    f = tmp_path / "tiny.gguf"
    if scaling["rope_type"] == "llama3":
        write_tiny_gguf(f, hf, rope_freqs=_llama3_divisors(hf))
        return f
    kv = {"llama.rope.scaling.type": scaling["rope_type"], "llama.rope.scaling.factor": scaling["factor"]}
    if "original_max_position_embeddings" in scaling:
        kv["llama.rope.scaling.original_context_length"] = scaling["original_max_position_embeddings"]
    write_tiny_gguf(f, hf, extra_kv=kv)
    return f


def _max_diff(model, hf, ids) -> float:
    with torch.no_grad():
        return (model(ids) - hf(ids).logits).abs().max().item()


CASES = {
    "llama3": (LLAMA3, 500000.0, 131072),
    "linear": ({"rope_type": "linear", "factor": 4.0}, 10000.0, 4096),
    "yarn": (YARN, 10000.0, 4096),
}


@pytest.mark.parametrize("case", list(CASES))
def test_scaled_gguf_matches_transformers_with_the_same_scaling(tmp_path, case):
    scaling, theta, max_pos = CASES[case]
    hf = _hf(scaling, theta, max_pos)
    f = _write_as_llamacpp_does(tmp_path, hf, scaling)
    ids = torch.randint(0, 97, (1, 512), generator=torch.Generator().manual_seed(0))
    model = load_gguf(f)
    assert model.cfg.rope_scaling == scaling
    assert _max_diff(model, hf, ids) <= TOL
    assert _max_diff(model, _unscaled(hf), ids) > 100 * TOL  # the scaling matters at these positions


def test_divisors_of_one_mean_no_scaling(tmp_path):
    hf = _hf(None, 500000.0, 8192)
    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, hf, rope_freqs=np.ones(16, dtype=np.float32))
    assert load_gguf(f).cfg.rope_scaling is None
    assert _rules(f) == []  # nothing scaled, so nothing for transformers to drop


@pytest.mark.parametrize("bad,match", [
    (lambda d: d * np.linspace(1.0, 1.5, d.size, dtype=np.float32), "not LLaMA 3.1's rescaling"),
    (lambda d: d[:8], "needs 16"),
    (lambda d: -d, "not a positive number"),
])
def test_rope_freqs_that_are_not_llama3_are_refused(tmp_path, bad, match):
    hf = _hf(LLAMA3, 500000.0, 131072)
    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, hf, rope_freqs=bad(_llama3_divisors(hf)))
    with pytest.raises(ValueError, match=match):
        load_gguf(f)


@pytest.mark.parametrize("kv,match", [
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
      "llama.rope.scaling.yarn_log_multiplier": 0.1}, "yarn_log_multiplier"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
      "llama.rope.scaling.attn_factor": 0.5}, "attn_factor"),
    ({"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 4.0}, "'longrope' is not supported"),
    ({"llama.rope.scaling.type": "yarn"}, "needs a factor"),
])
def test_unmapped_scaling_metadata_is_refused(tmp_path, kv, match):
    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, _hf(None, 10000.0, 4096), extra_kv=kv)
    with pytest.raises(ValueError, match=match):
        load_gguf(f)


@pytest.mark.parametrize("case", ["llama3", "yarn"])
def test_transformers_gguf_loader_drops_the_scaling(tmp_path, case):
    """The claim in io/gguf_rope.py's docstring: transformers reads such files as plain RoPE, both
    the rope_freqs tensor (llama3) and rope.scaling metadata (yarn)."""
    scaling, theta, max_pos = CASES[case]
    _write_as_llamacpp_does(tmp_path, _hf(scaling, theta, max_pos), scaling)
    cfg = transformers.AutoConfig.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    assert cfg.rope_parameters.get("rope_type", "default") == "default"


@torch.no_grad()
@pytest.mark.parametrize("case", ["llama3", "yarn"])
def test_static_decode_layout_applies_the_scaling(tmp_path, case):
    """The fast path (StaticDecoder: precomputed cos/sin, static cache) on a scaled GGUF against the
    eager Decoder with its KV cache: prefill of 500 tokens and 4 greedy steps, 1e-5 (float32)."""
    scaling, theta, max_pos = CASES[case]
    model = load_gguf(_write_as_llamacpp_does(tmp_path, _hf(scaling, theta, max_pos), scaling))
    ids = torch.randint(0, 97, (1, 500), generator=torch.Generator().manual_seed(1))
    static = StaticDecoder(model, 512)
    cache = KVCache(model.cfg, 1, 512, dtype=torch.float32)
    ref, got = model(ids, cache=cache, last_only=True)[:, -1], static.prefill(ids)
    for i in range(4):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        nxt = ref.argmax(-1, keepdim=True)
        ref, got = model(nxt, cache=cache)[:, -1], static.step(nxt, torch.tensor([500 + i]))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("case", list(CASES))
def test_scaled_gguf_matches_llama_cpp(tmp_path, case):
    """llama.cpp itself (llama-cpp-python, optional: skipped when not installed) on the same files.
    Its float32 CPU path differs from ours by 1.9e-3 on an unscaled tiny file (measured 2026-11-30),
    so the bound is 1e-2; plain RoPE is 0.18-2.8 off at these 256 positions."""
    llama_cpp = pytest.importorskip("llama_cpp")
    scaling, theta, max_pos = CASES[case]
    hf = _hf(scaling, theta, max_pos)
    f = _write_as_llamacpp_does(tmp_path, hf, scaling)
    ids = torch.randint(2, 97, (1, 256), generator=torch.Generator().manual_seed(0))
    llm = llama_cpp.Llama(str(f), n_ctx=512, logits_all=True, verbose=False, n_threads=2)
    llm.eval(ids[0].tolist())
    ref = torch.from_numpy(np.array(llm.scores[:256], dtype=np.float32))  # (256, vocab)
    assert (load_gguf(f)(ids)[0] - ref).abs().max().item() <= 1e-2
    assert (_unscaled(hf)(ids).logits[0] - ref).abs().max().item() > 10 * 1e-2


# `llamablock rope lint file.gguf` (rope_lint.lint_gguf) ------------------------------------------

def _rules(path) -> list[str]:
    return [w.rule for w in lint_file(path)]


def test_lint_names_a_llama31_file_converted_without_rope_freqs(tmp_path):
    name = {"general.name": "Llama 3.2 1B Instruct"}
    lost, kept = tmp_path / "lost.gguf", tmp_path / "kept.gguf"
    hf = _hf(LLAMA3, 500000.0, 131072)
    write_tiny_gguf(lost, _unscaled(hf), extra_kv=name)
    write_tiny_gguf(kept, hf, extra_kv=name, rope_freqs=_llama3_divisors(hf))
    assert _rules(lost) == ["gguf-missing-rope-freqs"]
    assert _rules(kept) == ["gguf-transformers-plain"]  # scaled, readable here, not by transformers


def test_lint_reports_what_the_loader_refuses_and_is_silent_on_plain_files(tmp_path):
    bad, plain = tmp_path / "bad.gguf", tmp_path / "plain.gguf"
    write_tiny_gguf(bad, _hf(None, 10000.0, 4096), extra_kv={
        "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0, "llama.rope.scaling.yarn_log_multiplier": 0.1})
    write_tiny_gguf(plain, _hf(None, 10000.0, 4096), extra_kv={"general.name": "SmolLM2 135M"})
    warnings = lint_file(bad)
    assert [w.rule for w in warnings] == ["gguf-unmapped", "gguf-transformers-plain"]
    assert "yarn_log_multiplier" in warnings[0].message
    assert _rules(plain) == []


def test_cli_lints_gguf_files(tmp_path, capsys):
    f = tmp_path / "lost.gguf"
    write_tiny_gguf(f, _hf(None, 500000.0, 131072), extra_kv={"general.name": "Meta-Llama-3.1-8B"})
    assert main(["rope", "lint", str(f)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{f}: gguf-missing-rope-freqs: ")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file")
    assert main(["rope", "lint", str(junk)]) == 2
    assert "is not a GGUF file" in capsys.readouterr().err
