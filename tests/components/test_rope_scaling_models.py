"""Whole-model parity with transformers for every RoPE scaling type, past the original length.

Tiny llamas (tests/hf_reference.py) with max_position_embeddings 16, so positions 16..47 are
"beyond the training length" and cheap. Logits to 1e-4 in float32 (the issue's bound).
Static "ntk" has no transformers type; its reference is transformers' default RoPE with the
closed-form raised base theta s^(d/(d-2)).
For the length-dependent types (dynamic, longrope) our KV-cached generation is compared, at
every length, with transformers' full uncached forward of the whole prefix: that is where a
key cached with a stale base would show.
"""

import pytest
import torch
from hf_reference import tiny_hf_model

import llamablock
from llamablock.rope_scaling import ntk_base

MAX_POS = 16
HEAD_DIM = 16  # 8 pairs: enough for yarn's ramp and llama3's band to have pairs on both sides


def _long(n):  # a LongRoPE factor list rising from 1 to 6 over the pairs
    return [1.0 + 5.0 * i / (n - 1) for i in range(n)]


SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": MAX_POS, "beta_fast": 4,
             "beta_slow": 1},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": MAX_POS // 2,
                    "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 8, "beta_slow": 0.5},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 0.5, "high_freq_factor": 4.0,
               "original_max_position_embeddings": MAX_POS},
    "llama3-degenerate": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                          "original_max_position_embeddings": MAX_POS},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": _long(8), "factor": 4.0,
                 "original_max_position_embeddings": MAX_POS},
}


def _pair(tmp_path, params, theta=10000.0, **kw):
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, head_dim=HEAD_DIM, max_position_embeddings=MAX_POS,
                       rope_parameters={"rope_theta": theta, **params}, **kw)
    hf.save_pretrained(tmp_path)
    return hf, llamablock.load_pretrained(tmp_path)


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_logits_match_transformers_beyond_original_length(tmp_path, name):
    hf, ours = _pair(tmp_path, SCALINGS[name])
    assert ours.cfg.rope_scaling["rope_type"] == SCALINGS[name]["rope_type"]
    ids = torch.randint(0, 97, (2, 48))  # positions 0..47: three times the original length
    with torch.no_grad():
        ref = hf(input_ids=ids, use_cache=False).logits
        got = ours(ids)
    assert (got - ref).abs().max().item() <= 1e-4
    if SCALINGS[name]["rope_type"] in ("dynamic", "longrope"):
        return  # their frequencies follow the largest position: offsets have their own test below
    # Offset, gapped positions far past the original length: a wrong angle changes the logits.
    pos = torch.stack([torch.arange(48), 3000 + 7 * torch.arange(48)])
    with torch.no_grad():
        # An explicit mask: without one (and without a cache) transformers reads gapped position
        # ids as packed sequences and masks across the gaps.
        ref = hf(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits
        got = ours(ids, position_ids=pos)
    assert (got - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", ["dynamic", "longrope"])
@pytest.mark.parametrize("start", [4, 40, 3000])
def test_length_dependent_frequencies_follow_the_largest_position(tmp_path, name, start):
    """A chunk of 12 tokens (inside the original 16) at positions start..start+11, no cache: like
    transformers, the frequencies follow the largest position + 1 (16 and past it: the scaled
    ones), not the number of tokens (12: the unscaled ones). A fresh transformers model each time
    (its dynamic type keeps the largest length it has seen)."""
    hf, ours = _pair(tmp_path, SCALINGS[name])
    ids = torch.randint(0, 97, (1, 12))
    pos = start + torch.arange(12)[None]
    with torch.no_grad():
        ref = hf(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits
        assert (ours(ids, position_ids=pos) - ref).abs().max().item() <= 1e-4


def test_static_ntk_model_equals_transformers_with_the_raised_base(tmp_path):
    factor = 4.0
    hf, _ = _pair(tmp_path / "ref", {"rope_type": "default"}, theta=ntk_base(10000.0, factor, HEAD_DIM))
    _, plain = _pair(tmp_path / "ours", {"rope_type": "default"})
    ours = llamablock.Decoder(plain.cfg.replace(rope_scaling={"rope_type": "ntk", "factor": factor}))
    ours.load_state_dict(plain.state_dict())  # same weights (same seed), static NTK on top
    ours.eval()
    ids = torch.randint(0, 97, (2, 48))
    pos = torch.stack([torch.arange(48), 3000 + 7 * torch.arange(48)])
    with torch.no_grad():
        ref = hf(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits
        assert (ours(ids, position_ids=pos) - ref).abs().max() <= 1e-4


@pytest.mark.parametrize("name", ["dynamic", "longrope"])
def test_cached_generation_across_the_base_change_equals_transformers_full_forward(tmp_path, name):
    # One layer: its keys and values come from the embeddings alone, so a cache that keeps keys
    # unrotated can equal the full forward exactly. (With more layers no cache can: the deeper
    # layers' inputs at earlier positions were computed under the earlier base. See
    # rope_scaling.rotates_cached_keys.)
    hf, ours = _pair(tmp_path, SCALINGS[name], num_hidden_layers=1)
    ids = torch.randint(0, 97, (1, 40))
    cache = llamablock.KVCache(ours.cfg, batch_size=1, max_len=40)
    worst, theirs = 0.0, 0.0
    with torch.no_grad():
        step = ours(ids[:, :10], cache=cache)  # prefill inside the original length
        hf_out = hf(input_ids=ids[:, :10], use_cache=True)
        for n in range(10, 41):  # lengths 10 .. 40: the frequencies change past 16
            ref = hf(input_ids=ids[:, :n], use_cache=False).logits[:, -1]  # full forward, increasing n only
            worst = max(worst, (step[:, -1] - ref).abs().max().item())
            theirs = max(theirs, (hf_out.logits[:, -1] - ref).abs().max().item())
            if n < 40:
                step = ours(ids[:, n : n + 1], cache=cache)
                hf_out = hf(input_ids=ids[:, n : n + 1], cache=hf_out.past_key_values, use_cache=True)
    assert worst <= 1e-4
    # transformers' own cache keeps keys rotated with the old frequencies: the trap is real here.
    assert theirs > 1e-2
