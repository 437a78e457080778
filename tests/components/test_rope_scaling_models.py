"""Whole-model parity with transformers for every RoPE scaling type, past the original length.

Tiny llamas (tests/hf_reference.py) with max_position_embeddings 16, so positions 16..47 are
"beyond the training length" and cheap. Logits to 1e-4 in float32 (the issue's bound).
Static "ntk" has no transformers type; its reference is transformers' default RoPE with the
closed-form raised base theta s^(d/(d-2)).
For the length-dependent types our KV-cached generation is compared at every length: "dynamic"
with transformers' cached generation (its cache keeps keys as rotated), dynamic-consistent and
longrope, which rotate cached keys again, with transformers' full uncached forward of the whole
prefix: that is where a key cached with a stale base would show.
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


def _as(ours, scaling):
    """The same weights with another rope_scaling."""
    other = llamablock.Decoder(ours.cfg.replace(rope_scaling=scaling))
    other.load_state_dict(ours.state_dict())
    return other.eval()


@pytest.mark.parametrize("name", ["dynamic-consistent", "longrope"])
def test_cache_of_unrotated_keys_equals_transformers_full_forward(tmp_path, name):
    # One layer: its keys and values come from the embeddings alone, so a cache that keeps keys
    # unrotated can equal the full forward exactly. (With more layers no cache can: the deeper
    # layers' inputs at earlier positions were computed under the earlier base. See
    # rope_scaling.rotates_cached_keys.)
    scaling = SCALINGS["dynamic" if name == "dynamic-consistent" else name]
    hf, ours = _pair(tmp_path, scaling, num_hidden_layers=1)
    ours = _as(ours, {**scaling, "rope_type": "dynamic-consistent"}) if name == "dynamic-consistent" else ours
    ids = torch.randint(0, 97, (1, 40))
    cache = llamablock.KVCache(ours.cfg, batch_size=1, max_len=40)
    worst = 0.0
    with torch.no_grad():
        step = ours(ids[:, :10], cache=cache)  # prefill inside the original length
        for n in range(10, 41):  # lengths 10 .. 40: the frequencies change past 16
            ref = hf(input_ids=ids[:, :n], use_cache=False).logits[:, -1]  # full forward, increasing n only
            worst = max(worst, (step[:, -1] - ref).abs().max().item())
            if n < 40:
                step = ours(ids[:, n : n + 1], cache=cache)
    assert worst <= 1e-4


def _generation(model_step, ids, prompt):
    """(len - prompt + 1, V): the prompt in one pass, then one token at a time."""
    out = [model_step(ids[:, :prompt], 0)]
    out += [model_step(ids[:, n:n + 1], n) for n in range(prompt, ids.shape[1])]
    return torch.stack(out)


@pytest.mark.parametrize("prompt", [10, 20])
def test_dynamic_generation_equals_transformers_cached_generation(tmp_path, prompt):
    """"dynamic" is transformers' generation: two layers, a prompt inside the original 16 tokens and
    one past it, then one token at a time to position 39, transformers' cache holding keys as they
    were rotated (position ids given). dynamic-consistent differs there: the two are not one method."""
    hf, ours = _pair(tmp_path, SCALINGS["dynamic"])
    ids = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        cache = llamablock.KVCache(ours.cfg, batch_size=1, max_len=40)
        got = _generation(lambda x, a: ours(x, cache=cache)[0, -1], ids, prompt)
        theirs = {}

        def hf_step(x, a):
            r = hf(input_ids=x, position_ids=a + torch.arange(x.shape[1])[None], cache=theirs.get("cache"),
                   use_cache=True)
            theirs["cache"] = r.past_key_values
            return r.logits[0, -1]

        want = _generation(hf_step, ids, prompt)
        consistent = _as(ours, {**SCALINGS["dynamic"], "rope_type": "dynamic-consistent"})
        cache = llamablock.KVCache(ours.cfg, batch_size=1, max_len=40)
        other = _generation(lambda x, a: consistent(x, cache=cache)[0, -1], ids, prompt)
    assert (got - want).abs().max().item() <= 1e-4
    assert (other - want).abs().max().item() > 1e-2
