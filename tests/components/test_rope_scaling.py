"""Every RoPE scaling type against transformers 5 (the reference), plus closed forms.

Tier 1 (component parity): inverse frequencies and attention factor equal to transformers'
ROPE_INIT_FUNCTIONS to 1e-6 relative; cos/sin at positions up to 131,072 equal to its rotary
embedding module to 1e-5. Our configs are read from the transformers config's own to_dict(),
so the loader (v5 `rope_parameters`) is exercised too; one test reads the v4 form.
Static "ntk" has no transformers type: it is checked against its closed form and against
transformers' dynamic NTK, which at factor 1 and length s*L is the same base.
"""

import math

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

from llamablock import ModelConfig
from llamablock.io.hf_config import config_from_hf
from llamablock.rope import rope_cos_sin
from llamablock.rope_scaling import (
    RopeSpec,
    default_inv_freq,
    dynamic_base,
    follows_length,
    ntk_base,
    rope_frequencies,
    rotates_cached_keys,
    yarn_frequencies,
)


def _factors(n, seed, lo=1.0, hi=6.0):  # a LongRoPE factor list of n entries, rising like Phi-3's
    g = torch.Generator().manual_seed(seed)
    return sorted((lo + (hi - lo) * torch.rand(n, generator=g)).tolist())


# (rope_parameters, head_dim, max_position_embeddings): several parameter sets per type,
# head widths 64/80/128/256, partial rotary, and Llama 3.1 / 3.2 / 4, Qwen2.5-YaRN, DeepSeek,
# Phi-3 values (each from the model's published config.json).
CASES = [
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, 64, 4096),
    ({"rope_type": "linear", "factor": 4.5, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, 80, 2048),
    ({"rope_type": "linear", "factor": 8.0, "rope_theta": 500000.0}, 128, 8192),
    ({"rope_type": "linear", "factor": 3.0, "rope_theta": 10000.0}, 256, 4096),
    ({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}, 64, 4096),
    ({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, 80, 2048),
    ({"rope_type": "dynamic", "factor": 8.0, "rope_theta": 500000.0}, 128, 8192),
    ({"rope_type": "dynamic", "factor": 1.5, "rope_theta": 1e6}, 256, 4096),
    # Qwen2.5-7B-Instruct's README: factor 4, original 32768
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}, 128, 131072),
    # DeepSeek-V3: factor 40, mscale = mscale_all_dim = 1, beta 32/1, original 4096
    ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
      "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}, 64, 163840),
    ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
      "mscale_all_dim": 1.0, "rope_theta": 10000.0}, 64, 32768),
    ({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 2048, "attention_factor": 1.25,
      "truncate": False, "rope_theta": 10000.0}, 80, 32768),
    ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "beta_fast": 16,
      "beta_slow": 2, "rope_theta": 500000.0, "partial_rotary_factor": 0.5}, 256, 32768),
    ({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096, "rope_theta": 10000.0}, 128, 16384),
    # Llama 3.1 8B, Llama 3.2 1B, Llama 4 Scout (low == high: the degenerate band)
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192, "rope_theta": 500000.0}, 128, 131072),
    ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192, "rope_theta": 500000.0}, 64, 131072),
    ({"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 8192, "rope_theta": 500000.0}, 128, 131072),
    ({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
      "original_max_position_embeddings": 2048, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, 80, 8192),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192, "rope_theta": 500000.0}, 256, 65536),
    # Phi-3-mini-128k: original 4096, max 131072, no factor (ratio 32)
    ({"rope_type": "longrope", "short_factor": _factors(48, 0, 1.0, 1.1), "long_factor": _factors(48, 1, 1.0, 30.0),
      "original_max_position_embeddings": 4096, "rope_theta": 10000.0}, 96, 131072),
    ({"rope_type": "longrope", "short_factor": _factors(32, 2), "long_factor": _factors(32, 3),
      "original_max_position_embeddings": 4096, "factor": 8.0, "rope_theta": 10000.0}, 64, 32768),
    ({"rope_type": "longrope", "short_factor": _factors(20, 4), "long_factor": _factors(20, 5),
      "original_max_position_embeddings": 2048, "attention_factor": 1.1, "rope_theta": 10000.0,
      "partial_rotary_factor": 0.5}, 80, 16384),
    ({"rope_type": "longrope", "short_factor": _factors(64, 6), "long_factor": _factors(64, 7),
      "original_max_position_embeddings": 8192, "rope_theta": 1e6}, 128, 131072),
    ({"rope_type": "longrope", "short_factor": _factors(128, 8), "long_factor": _factors(128, 9),
      "original_max_position_embeddings": 4096, "factor": 16.0, "rope_theta": 10000.0}, 256, 65536),
]
IDS = [f"{p['rope_type']}-d{hd}-{i}" for i, (p, hd, _) in enumerate(CASES)]


def _pair(params, head_dim, max_pos):
    hf = transformers.LlamaConfig(vocab_size=16, hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                  max_position_embeddings=max_pos, rope_parameters=dict(params),
                                  num_hidden_layers=1, intermediate_size=8)
    return hf, config_from_hf(hf.to_dict())


def _lengths(params, max_pos):  # the lengths at which length-dependent types change
    orig = params.get("original_max_position_embeddings", max_pos)
    return [None, orig, orig + 1, 3 * max_pos, 131072]


def _close(a, b, rel):
    return ((a - b).abs() <= rel * b.abs()).all()


@pytest.mark.parametrize("params,head_dim,max_pos", CASES, ids=IDS)
def test_inv_freq_and_attention_factor_match_transformers(params, head_dim, max_pos):
    hf, cfg = _pair(params, head_dim, max_pos)
    assert cfg.rotary_dim == int(head_dim * params.get("partial_rotary_factor", 1.0))
    for n in _lengths(params, max_pos):
        ref, ref_att = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, "cpu", seq_len=n)
        got, att = rope_frequencies(cfg, seq_len=n)
        assert got.dtype == torch.float32 and got.shape == ref.shape == (cfg.rotary_dim // 2,)
        assert _close(got, ref, 1e-6), n
        assert math.isclose(att, float(ref_att), rel_tol=1e-6), (n, att, ref_att)


@pytest.mark.parametrize("params,head_dim,max_pos", CASES, ids=IDS)
def test_cos_sin_to_131072_match_transformers_rotary_embedding(params, head_dim, max_pos):
    hf, cfg = _pair(params, head_dim, max_pos)
    g = torch.Generator().manual_seed(0)
    pos = torch.cat([torch.arange(64), torch.randint(0, 131072, (192,), generator=g), torch.tensor([131071])])
    pos = pos.sort().values[None]  # (1, t)
    x = torch.zeros(1, dtype=torch.float32)
    orig = params.get("original_max_position_embeddings", max_pos)
    for p in (pos[:, pos[0] < orig], pos):  # within the original length (short factors, trained base), and past it
        ref_cos, ref_sin = LlamaRotaryEmbedding(hf)(x, p)  # a fresh module: dynamic types keep state
        cos, sin = rope_cos_sin(cfg, p, torch.float32, seq_len=int(p.max()) + 1)
        r2 = cfg.rotary_dim // 2
        assert (cos - ref_cos[..., :r2]).abs().max() <= 1e-5 and (sin - ref_sin[..., :r2]).abs().max() <= 1e-5


@pytest.mark.parametrize("head_dim,partial", [(64, 1.0), (80, 0.5), (128, 0.25), (256, 1.0)])
def test_default_with_partial_rotary_matches_transformers_phi(head_dim, partial):
    # Llama's default ignores partial_rotary_factor; Phi's default honours it (the reference here).
    hf = transformers.PhiConfig(vocab_size=16, hidden_size=4 * head_dim, num_attention_heads=4,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": partial})
    cfg = ModelConfig(vocab_size=16, d_model=4 * head_dim, n_layers=1, n_heads=4, partial_rotary_factor=partial)
    pos = torch.tensor([[0, 1, 17, 4095, 65536, 131071]])
    ref_cos, ref_sin = PhiRotaryEmbedding(hf)(torch.zeros(1), pos)
    cos, sin = rope_cos_sin(cfg, pos, torch.float32)
    r2 = cfg.rotary_dim // 2
    assert (cos - ref_cos[..., :r2]).abs().max() <= 1e-5 and (sin - ref_sin[..., :r2]).abs().max() <= 1e-5


@pytest.mark.parametrize("head_dim,factor", [(64, 2.0), (80, 4.0), (128, 8.0), (256, 3.0)])
def test_static_ntk_is_its_closed_form(head_dim, factor):
    cfg = ModelConfig(vocab_size=16, d_model=4 * head_dim, n_layers=1, n_heads=4, max_seq_len=4096,
                      rope_scaling={"rope_type": "ntk", "factor": factor})
    d = cfg.rotary_dim
    got, att = rope_frequencies(cfg)
    base = 10000.0 * factor ** (d / (d - 2))  # bloc97's theta' = theta s^(d/(d-2))
    closed = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    assert att == 1.0 and _close(got.double(), closed, 1e-6)
    # The fastest pair is untouched; the slowest is interpolated by exactly the factor.
    default = default_inv_freq(10000.0, d)
    assert got[0] == default[0] == 1.0
    assert math.isclose(got[-1].item(), default[-1].item() / factor, rel_tol=1e-6)
    # transformers' dynamic NTK at factor 1 and length s*L has the very same base.
    hf = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                  max_position_embeddings=4096,
                                  rope_parameters={"rope_type": "dynamic", "factor": 1.0, "rope_theta": 10000.0})
    ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=int(factor * 4096))
    assert _close(got, ref, 1e-6) and ntk_base(10000.0, factor, d) == pytest.approx(base, rel=1e-12)


def test_v4_rope_scaling_form_reads_the_same_as_v5():
    params = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    common = dict(model_type="llama", vocab_size=16, hidden_size=512, num_attention_heads=4, num_hidden_layers=1,
                  intermediate_size=8, max_position_embeddings=131072)
    v4 = config_from_hf({**common, "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **params}})
    v5 = config_from_hf({**common, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **params}})
    assert v4.rope_theta == v5.rope_theta == 500000.0 and v4.rope_scaling == v5.rope_scaling
    assert torch.equal(rope_frequencies(v4)[0], rope_frequencies(v5)[0])


def test_both_forms_present_follow_transformers_which_takes_rope_scaling():
    raw = dict(model_type="llama", vocab_size=16, hidden_size=256, num_attention_heads=4, num_hidden_layers=1,
               intermediate_size=8, rope_theta=30000.0, rope_scaling={"rope_type": "linear", "factor": 2.0},
               rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})
    ref = transformers.LlamaConfig.from_dict(dict(raw)).rope_parameters
    ours = config_from_hf(raw)
    assert ours.rope_scaling["rope_type"] == ref["rope_type"] == "linear" and ours.rope_theta == ref["rope_theta"]


def test_yarn_switches_reproduce_older_readings():
    cfg = ModelConfig(vocab_size=16, d_model=512, n_layers=1, n_heads=4, max_seq_len=40960,
                      rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})
    # transformers 4.x override: factor = 40960 / 4096 = 10 (ln 10 in the attention factor)
    _, att = yarn_frequencies(cfg, factor_from_lengths=True)
    assert math.isclose(att, 0.1 * math.log(10.0) + 1)
    # llama.cpp ext_factor = 0: pure interpolation by the factor, no attention term
    inv, att0 = yarn_frequencies(cfg, ext_factor=0.0)
    assert att0 == 1.0 and _close(inv, default_inv_freq(10000.0, 128) / 4.0, 1e-6)


def test_llama4_degenerate_band_is_finite_and_a_step():
    cfg = ModelConfig(vocab_size=16, d_model=512, n_layers=1, n_heads=4, max_seq_len=131072, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 1.0, "original_max_position_embeddings": 8192})
    inv, _ = rope_frequencies(cfg)
    base = default_inv_freq(500000.0, 128)
    slow = 2 * math.pi / base > 8192
    assert torch.isfinite(inv).all()
    assert torch.equal(inv[~slow], base[~slow]) and torch.equal(inv[slow], base[slow] / 16.0)


def test_dynamic_unclamped_base_going_negative_names_the_field():
    assert dynamic_base(10000.0, 8.0, 128, 100, 4096) == 10000.0  # clamped: short sequences keep the base
    with pytest.raises(ValueError, match=r"non-positive: rope_scaling\.factor=8.0 at length 100"):
        dynamic_base(10000.0, 8.0, 128, 100, 4096, clamp=False)


# Properties (hypothesis) ----------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

WIDTHS = st.sampled_from([64, 80, 128, 256])


def _cfg(head_dim, max_seq_len=4096, theta=10000.0, **scaling):
    return ModelConfig(vocab_size=16, d_model=4 * head_dim, n_layers=1, n_heads=4, max_seq_len=max_seq_len,
                       rope_theta=theta, rope_scaling=scaling or None)


@settings(max_examples=60, deadline=None)
@given(head_dim=WIDTHS, factor=st.floats(1.0, 64.0), k=st.integers(0, 6),
       p=st.lists(st.integers(0, 131072), min_size=1, max_size=8))
def test_linear_maps_position_p_to_p_over_s(head_dim, factor, k, p):
    pos = torch.tensor([p])
    default = _cfg(head_dim)
    inv = rope_frequencies(default)[0].double()
    # Any factor: the angle of p under linear(s) is the angle of p/s, up to float32 rounding of s
    # and of theta/s (torch divides in float32): two units in the last place, 2^-23 relative.
    lin = rope_frequencies(_cfg(head_dim, rope_type="linear", factor=factor))[0].double()
    a, b = pos.double()[..., None] * lin, (pos.double() / factor)[..., None] * inv
    assert ((a - b).abs() <= 2**-23 * b.abs()).all()
    # A power-of-two factor divides exactly: cos/sin of p under linear(2^k) equal those of p/2^k bit for bit.
    s = float(2**k)
    got = rope_cos_sin(_cfg(head_dim, rope_type="linear", factor=s), pos, torch.float32)
    ref = rope_cos_sin(default, pos.float() / s, torch.float32)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@settings(max_examples=60, deadline=None)
@given(head_dim=WIDTHS, factor=st.floats(1.0, 64.0), original=st.integers(16, 65536), frac=st.floats(0.0, 1.0),
       theta=st.sampled_from([10000.0, 500000.0, 1e6]))
def test_dynamic_leaves_sequences_within_the_original_length_unchanged(head_dim, factor, original, frac, theta):
    n = max(1, int(frac * original))
    dyn = _cfg(head_dim, max_seq_len=original, theta=theta, rope_type="dynamic", factor=factor)
    assert torch.equal(rope_frequencies(dyn, seq_len=n)[0], default_inv_freq(theta, head_dim))
    if factor > 1.001:  # and past it, every pair but the fastest slows down
        longer = rope_frequencies(dyn, seq_len=2 * original)[0]
        assert longer[0] == 1.0 and (longer[1:] < default_inv_freq(theta, head_dim)[1:]).all()


@settings(max_examples=60, deadline=None)
@given(head_dim=WIDTHS, factor=st.floats(1.0, 64.0), low=st.floats(0.25, 4.0), extra=st.floats(0.0, 8.0),
       original=st.integers(256, 65536), theta=st.sampled_from([10000.0, 500000.0]))
def test_llama3_keeps_fast_pairs_and_divides_slow_pairs(head_dim, factor, low, extra, original, theta):
    high = low + extra  # extra == 0 is Llama 4's degenerate band
    cfg = _cfg(head_dim, max_seq_len=2 * original, theta=theta, rope_type="llama3", factor=factor,
               low_freq_factor=low, high_freq_factor=high, original_max_position_embeddings=original)
    got, att = rope_frequencies(cfg)
    base = default_inv_freq(theta, head_dim)
    wavelen = 2 * math.pi / base
    fast, slow = wavelen < original / high, wavelen > original / low
    assert att == 1.0 and torch.isfinite(got).all()
    assert torch.equal(got[fast], base[fast]) and torch.equal(got[slow], base[slow] / factor)
    middle = ~fast & ~slow  # in between: never faster than unchanged, never slower than divided
    assert (got[middle] <= base[middle] * (1 + 1e-6)).all() and (got[middle] >= base[middle] / factor * (1 - 1e-6)).all()


# Bad input: a clear error naming the field ----------------------------------------------------
@pytest.mark.parametrize("kw,msg", [
    (dict(rope_scaling={"rope_type": "linear", "factor": 0.5}), r"rope_scaling\.factor must be >= 1.0, got 0\.5"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 0.9}), r"rope_scaling\.factor must be >= 1"),
    (dict(rope_theta=0.0), "rope_theta must be positive"),
    (dict(rope_theta=-10000.0), "rope_theta must be positive"),
    (dict(rope_scaling={"rope_type": "ntk-by-parts", "factor": 2.0}), r"rope_scaling\.rope_type 'ntk-by-parts' is unknown"),
    (dict(rope_scaling={"rope_type": "linear"}), r"rope_scaling\.factor is required for rope_type 'linear'"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": "2"}), r"rope_scaling\.factor must be a number"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}),
     r"rope_scaling\.high_freq_factor \(1\.0\) must be >= low_freq_factor"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}),
     r"rope_scaling\.high_freq_factor is required"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 1, "beta_slow": 32}),
     r"rope_scaling\.beta_fast \(1\) must be >= beta_slow"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}),
     r"rope_scaling\.original_max_position_embeddings must be a positive integer"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 32}),
     r"rope_scaling\.short_factor must be a list of rotary_dim/2 = 32 numbers, got 3"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}, head_dim=2, d_model=8),
     r"rope_type 'dynamic' needs a rotary width above 2"),
])
def test_bad_scaling_is_a_clear_error_naming_the_field(kw, msg):
    base = dict(vocab_size=16, d_model=256, n_layers=1, n_heads=4)
    with pytest.raises(ValueError, match=msg):
        ModelConfig(**{**base, **kw})


def test_top_level_original_length_wins_as_in_transformers():
    # Phi-3 writes original_max_position_embeddings at the top level; transformers' rotary
    # embedding gives it priority over the scaling dict's own value.
    raw = dict(model_type="llama", vocab_size=16, hidden_size=256, num_attention_heads=4, num_hidden_layers=1,
               intermediate_size=8, max_position_embeddings=131072, original_max_position_embeddings=1024,
               rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})
    ref = LlamaRotaryEmbedding(transformers.LlamaConfig.from_dict(dict(raw))).inv_freq
    ours = config_from_hf(raw)
    assert ours.rope_scaling["original_max_position_embeddings"] == 1024
    assert torch.equal(rope_frequencies(ours)[0], ref)


@pytest.mark.parametrize("kind", ["dynamic", "dynamic-consistent"])
def test_dynamic_grows_from_the_original_length_its_dict_names(kind):
    """A run past the context (--ctx-size 16384) keeps max_seq_len for the context it allows and
    names L = 4096 in the dict: the frequencies are transformers' dynamic with
    max_position_embeddings = 4096 at every length, both dynamic types alike."""
    hf, _ = _pair({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}, 64, 4096)
    cfg = RopeSpec(10000.0, 64, 16384, {"rope_type": kind, "factor": 4.0, "original_max_position_embeddings": 4096})
    for n in (None, 4096, 4097, 9000, 16384):
        ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=n)
        assert _close(rope_frequencies(cfg, seq_len=n)[0], ref, 1e-6), n


def test_which_types_follow_the_length_and_which_rotate_cached_keys_again():
    def cfg(kind):
        return RopeSpec(10000.0, 64, 4096, {"rope_type": kind, "factor": 2.0} if kind != "default" else None)

    follow = {k for k in ("default", "linear", "ntk", "dynamic", "dynamic-consistent") if follows_length(cfg(k))}
    again = {k for k in ("default", "linear", "ntk", "dynamic", "dynamic-consistent") if rotates_cached_keys(cfg(k))}
    assert follow == {"dynamic", "dynamic-consistent"} and again == {"dynamic-consistent"}
