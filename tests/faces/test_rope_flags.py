"""The context and RoPE-scaling flags of generate, perplexity and serve (io/scaling_flags.py).

Parity: a tiny transformers llama trained (so its config says) to 16 positions is opened as a
command opens it, the flags applied, the plan decided and built on the eager engine, and the
engine that `generate` runs (prefill, then one step per token) is run to position 39, past the
trained context; every logit equals transformers' with the `rope_scaling` each flag set means,
written out here by hand, to 1e-4 in float32. Static "ntk" has no transformers type: its
reference is the default RoPE at the closed-form base (rope_scaling.ntk_base). The perplexity
command with yarn is checked against the same windows scored by hand with the scaled model.
The refusals are in tests/faces/test_bad_flags.py, the plan's rule in tests/fast/test_plan.py.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch
import torch.nn.functional as F
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli
from llamablock.fast.plan import build, decide
from llamablock.io.scaling_flags import add_scaling_arguments, scaled_source
from llamablock.io.source import open_source
from llamablock.rope_scaling import ntk_base

TRAINED = 16
HEAD_DIM = 16  # 8 pairs: yarn's ramp and llama3's band have pairs on both sides
THETA = 10000.0
N = 40  # tokens run: positions 16..39 are past the trained context


def _hf(rope_parameters: dict, theta: float = THETA, layers: int = 2):
    return tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, head_dim=HEAD_DIM, num_hidden_layers=layers,
                         max_position_embeddings=TRAINED, rope_parameters={"rope_theta": theta, **rope_parameters})


def flags(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_scaling_arguments(p)
    return p.parse_args(argv)


# (flags, the rope_scaling transformers is given, its rope_theta)
CASES = {
    "linear": (["--ctx-size", "64", "--rope-scaling", "linear"], {"rope_type": "linear", "factor": 4.0}, THETA),
    "ntk": (["--ctx-size", "64", "--rope-scaling", "ntk"], {"rope_type": "default"}, ntk_base(THETA, 4.0, HEAD_DIM)),
    "yarn": (["--ctx-size", "64", "--rope-scaling", "yarn"],
             {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED}, THETA),
    # a ramp over pairs 0..4 instead of the defaults' 0..1 (32 and 1 turns in 16 positions)
    "yarn, its betas": (["--ctx-size", "64", "--rope-scaling", "yarn", "--yarn-beta-fast", "1",
                         "--yarn-beta-slow", "0.05"],
                        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED,
                         "beta_fast": 1.0, "beta_slow": 0.05}, THETA),
    "yarn, scale and attention factor": (
        ["--ctx-size", "48", "--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-attn-factor", "1.5"],
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": TRAINED,
         "attention_factor": 1.5 * (0.1 * math.log(2.0) + 1)}, THETA),  # llama.cpp's: a multiplier of 0.1 ln s + 1
    "llama3": (["--ctx-size", "64", "--rope-scaling", "llama3"],
               {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": TRAINED,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}, THETA),
    "linear with another base": (["--ctx-size", "64", "--rope-scaling", "linear", "--rope-freq-base", "500"],
                                 {"rope_type": "linear", "factor": 4.0}, 500.0),
}


def _engine_logits(path, argv: list[str]) -> torch.Tensor:
    """(N, V): generate's engine on the flags' scaled model, the prompt's first 20 tokens prefilled
    and the rest stepped one at a time (logits of positions 19..N-1; the rows before are zero)."""
    own = open_source(path, tokenizer=False)
    source = scaled_source(own, flags(argv))
    plan = decide(source, "auto", "eager", "cpu", rescaled=source.cfg != own.cfg)
    engine = build(source, plan).engine
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (1, N))
    engine.prepare(N)
    out = torch.zeros(N, 97)
    with torch.no_grad():
        out[19] = engine.prefill(ids[:, :20])[0]
        for pos in range(20, N):
            out[pos] = engine.step(ids[:, pos:pos + 1], pos)[0]
    return ids, out


@pytest.mark.parametrize("name", sorted(CASES))
def test_generates_engine_equals_transformers_past_the_trained_context(tmp_path, name):
    argv, scaling, theta = CASES[name]
    _hf({"rope_type": "default"}).save_pretrained(tmp_path)  # the checkpoint, unscaled
    ids, got = _engine_logits(tmp_path, argv)
    ref = _hf(scaling, theta)  # the same weights (same seed) with the scaling in its config
    with torch.no_grad():
        want = ref(input_ids=ids, use_cache=False).logits[0]
    assert (got[19:] - want[19:]).abs().max().item() <= 1e-4


def test_dynamic_equals_transformers_cached_generation(tmp_path):
    """--rope-scaling dynamic is transformers' generation with its cache: the prompt (20 tokens, past
    the trained 16) in one pass, then one token at a time, each key kept as it was rotated."""
    _hf({"rope_type": "default"}).save_pretrained(tmp_path)
    ids, got = _engine_logits(tmp_path, ["--ctx-size", "64", "--rope-scaling", "dynamic"])
    want = _hf_generation(_hf({"rope_type": "dynamic", "factor": 4.0}), ids, 20)  # fresh: it keeps state
    assert (got[19:] - want).abs().max().item() <= 1e-4


def _hf_generation(ref, ids, prompt: int) -> torch.Tensor:
    """transformers' cached generation: the prompt in one pass, then one token at a time with
    position ids, its cache holding keys as they were rotated. (N - prompt + 1, V)."""
    with torch.no_grad():
        r = ref(input_ids=ids[:, :prompt], use_cache=True)
        want = [r.logits[0, -1]]
        for pos in range(prompt, N):
            r = ref(input_ids=ids[:, pos:pos + 1], position_ids=torch.tensor([[pos]]), cache=r.past_key_values,
                    use_cache=True)
            want.append(r.logits[0, -1])
    return torch.stack(want)


def test_dynamic_on_the_servers_batched_engine_is_transformers_generation(tmp_path):
    """serve's engine prefills prompts in chunks; under dynamic NTK a chunk would turn the prompt's
    first tokens at a shorter length than transformers' one-pass prefill, so such a model takes its
    prompt in one pass (and one row at a time: rows of other lengths would share one length)."""
    from llamablock.runtime.batch import EagerBatchEngine

    _hf({"rope_type": "default"}).save_pretrained(tmp_path)
    own = open_source(tmp_path, tokenizer=False)
    source = scaled_source(own, flags(["--ctx-size", "64", "--rope-scaling", "dynamic"]))
    engine = EagerBatchEngine(build(source, decide(source, "auto", "eager", "cpu", rescaled=True)).model, chunk=8)
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (1, N))
    with torch.no_grad():
        got = [engine.prefill(engine.add(ids[0, :20].tolist(), N))[0]]
        got += [engine.step(ids[0, pos:pos + 1])[0] for pos in range(20, N)]
    assert engine.max_rows == 1
    assert (torch.stack(got) - _hf_generation(_hf({"rope_type": "dynamic", "factor": 4.0}), ids, 20)).abs().max() <= 1e-4


def test_a_models_own_dynamic_keeps_its_original_length_under_a_smaller_context(tmp_path):
    _hf({"rope_type": "dynamic", "factor": 2.0}).save_pretrained(tmp_path)
    cfg = scaled_source(open_source(tmp_path, tokenizer=False), flags(["--ctx-size", "8"])).cfg
    assert cfg.max_seq_len == 8 and cfg.rope_scaling == {"rope_type": "dynamic", "factor": 2.0,
                                                         "original_max_position_embeddings": TRAINED}


def test_dynamic_consistent_equals_transformers_full_forward(tmp_path):
    """--rope-scaling dynamic-consistent: each position is compared with transformers' full forward of
    the whole sequence up to it (one layer, where a cache can equal it: rope_scaling.rotates_cached_keys)."""
    _hf({"rope_type": "default"}, layers=1).save_pretrained(tmp_path)
    ids, got = _engine_logits(tmp_path, ["--ctx-size", "64", "--rope-scaling", "dynamic-consistent"])
    ref = _hf({"rope_type": "dynamic", "factor": 4.0}, layers=1)
    with torch.no_grad():
        for pos in range(19, N):  # increasing lengths only: transformers' dynamic keeps the longest seen
            want = ref(input_ids=ids[:, :pos + 1], use_cache=False).logits[0, -1]
            assert (got[pos] - want).abs().max().item() <= 1e-4


def test_a_models_own_scaling_is_kept_unless_a_flag_replaces_it(tmp_path):
    own_scaling = {"rope_type": "linear", "factor": 2.0}
    _hf(own_scaling).save_pretrained(tmp_path)
    own = open_source(tmp_path, tokenizer=False)
    assert scaled_source(own, flags([])) is own
    assert decide(own, engine="eager").scaling == "linear"
    yarn = scaled_source(own, flags(["--rope-scaling", "yarn", "--ctx-size", "32"])).cfg
    assert yarn.rope_scaling["rope_type"] == "yarn" and yarn.max_seq_len == 32
    assert scaled_source(own, flags(["--rope-scaling", "none"])).cfg.rope_scaling is None


@pytest.fixture
def tiny(tmp_path):
    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64))
    return f


def test_verbose_prints_the_scaling_in_force(tiny, capsys):
    f = tiny
    argv = ["generate", "--model", str(f), "--prompt", "abc", "--max-new-tokens", "2", "--verbose"]
    assert cli.main([*argv, "--ctx-size", "128", "--rope-scaling", "yarn"]) == 0
    err = capsys.readouterr().err
    assert "context: 128 tokens, RoPE scaling yarn" in err and "no compiled build for the context and RoPE scaling these flags set" in err
    assert cli.main(argv) == 0
    assert "context: 64 tokens, RoPE scaling none" in capsys.readouterr().err


def test_perplexity_past_the_trained_context_scores_the_windows_of_the_scaled_model(tiny, tmp_path, capsys):
    f, text = tiny, tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; " * 12)
    argv = ["perplexity", str(text), "--model", str(f), "--context", "128", "--stride", "128", "--max-tokens", "256",
            "--json", "--rope-scaling", "yarn", "--rope-scale", "2"]
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    # By hand: the config the flags mean, two windows of 128 tokens, each scoring its last 127.
    source = open_source(f)
    cfg = source.cfg.replace(max_seq_len=128, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                            "original_max_position_embeddings": 64})
    source = source.__class__(**{**source.__dict__, "cfg": cfg})
    model = build(source, decide(source, "auto", "eager")).model
    ids = torch.tensor(source.tokenizer.encode(text.read_text())[:256])
    assert len(ids) == 256
    with torch.no_grad():
        nll = sum(F.cross_entropy(model(w[None])[0, :-1].float(), w[1:], reduction="sum").item()
                  for w in ids.split(128))
    assert got["tokens_scored"] == 254
    assert got["perplexity"] == pytest.approx(math.exp(nll / 254), rel=1e-5)
    assert got["rope_scaling"]["rope_type"] == "yarn"


@pytest.mark.parametrize("method", ["yarn", "linear"])
def test_perplexity_at_2l_equals_rope_evals(tiny, tmp_path, capsys, method):
    """`perplexity --rope-scaling M --rope-scale 2 --context 2L` and rope eval's losses for M at factor 2
    (studies/context_extension.method_losses, its own scaled model) on the same 2L tokens: two paths
    to one number (rel 1e-5: the same float32 maths, summed in another order)."""
    from llamablock.studies.context_extension import method_losses

    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; " * 12)
    argv = ["perplexity", str(text), "--model", str(tiny), "--context", "128", "--stride", "128", "--max-tokens", "128",
            "--json", "--dtype", "float32", "--rope-scaling", method, "--rope-scale", "2"]
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    source = open_source(tiny)  # trained context L = 64
    model = build(source, decide(source, "float32", "eager")).model
    ids = torch.tensor(source.tokenizer.encode(text.read_text())[:128])[None]
    with torch.no_grad():
        losses = method_losses(model, ids, method, 2.0)
    assert got["tokens_scored"] == losses.numel() == 127
    assert got["perplexity"] == pytest.approx(math.exp(losses.double().mean().item()), rel=1e-5)


def test_serve_runs_the_scaled_model_and_never_a_compiled_build_of_the_unscaled_one(tiny):
    from llamablock.web.generation import load_served

    scaling = flags(["--ctx-size", "128", "--rope-scaling", "yarn"])
    served = load_served(str(tiny), max_queue=1, parallel=1, scaling=scaling)
    try:
        assert served.model.cfg.max_seq_len == 128 and served.model.cfg.rope_scaling["rope_type"] == "yarn"
        assert type(served.worker.engine).__name__ == "EagerBatchEngine"
    finally:
        served.worker.close()
    dynamic = flags(["--ctx-size", "128", "--rope-scaling", "dynamic"])  # a static step cannot follow it
    with pytest.raises(ValueError, match="changes RoPE's frequencies with the length"):
        load_served(str(tiny), max_queue=1, parallel=1, engine="compiled", scaling=dynamic)
