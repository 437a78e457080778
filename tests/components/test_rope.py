"""RoPE (section 15.1): against transformers' apply_rotary_pos_emb and against complex
multiplication (the closed form of Meta's code), the relative-position property in both pair
layouts, and the q/k permutation between layouts."""

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from llamablock import Decoder, ModelConfig
from llamablock.rope import apply_rope, permute_qk, rope_cos_sin


def _cfg(**kw):
    return ModelConfig(**{**dict(vocab_size=50, d_model=64, n_layers=1, n_heads=4, head_dim=16), **kw})


def test_half_layout_equals_transformers_bit_for_bit():
    cfg = _cfg()
    q, k = torch.randn(2, 4, 10, 16), torch.randn(2, 4, 10, 16)
    pos = torch.stack([torch.arange(10), 5000 + 3 * torch.arange(10)])
    cos, sin = rope_cos_sin(cfg, pos, torch.float32)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float) / 16))  # transformers' default init
    emb = torch.cat([pos[..., None].float() * inv] * 2, -1)
    ref_q, ref_k = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    assert torch.equal(apply_rope(q, cos, sin, "half"), ref_q)
    assert torch.equal(apply_rope(k, cos, sin, "half"), ref_k)


def test_interleaved_layout_equals_complex_rotation():
    """Meta's llama rotates (x0 + i x1) by multiplying with exp(i m theta): the same maths."""
    cfg = _cfg(rope_layout="interleaved")
    x = torch.randn(1, 4, 12, 16, dtype=torch.float64)
    pos = torch.arange(12)[None] * 997
    cos, sin = rope_cos_sin(cfg, pos, torch.float64)
    theta = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    z = torch.view_as_complex(x.reshape(1, 4, 12, 8, 2).contiguous())
    rot = torch.polar(torch.ones(12, 8, dtype=torch.float64), pos[0, :, None].double() * theta)
    ref = torch.view_as_real(z * rot).flatten(-2)
    # cos/sin are computed from float32 angles (as every reference does), hence 1e-6 not 1e-12.
    assert (apply_rope(x, cos, sin, "interleaved") - ref).abs().max().item() < 1e-6 * 12 * 997


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("offset", [0, 1, 7, 63, 200])
def test_score_depends_only_on_offset(layout, offset):
    """<R_m q, R_n k> with m - n fixed is the same at every absolute position (float32 rounding)."""
    cfg = _cfg(rope_layout=layout, head_dim=32, n_heads=2)
    q, k = torch.randn(32), torch.randn(32)
    scores = []
    for n in (0, 10, 500, 3000, 20000):
        m = n + offset
        pos = torch.tensor([[m, n]])
        cos, sin = rope_cos_sin(cfg, pos, torch.float32)
        rq = apply_rope(q.view(1, 1, 1, 32).expand(1, 1, 2, 32), cos, sin, layout)[0, 0, 0]
        rk = apply_rope(k.view(1, 1, 1, 32).expand(1, 1, 2, 32), cos, sin, layout)[0, 0, 1]
        scores.append((rq @ rk).item())
    scale = q.norm().item() * k.norm().item()
    # float32 angles at position 20000 carry ~20000 * 2^-24 rad of rounding: 1.2e-3 rad worst case.
    assert max(scores) - min(scores) <= 2e-3 * scale


@pytest.mark.parametrize("rotary_fraction", [1.0, 0.5])
def test_layout_permutation_round_trips_exactly(rotary_fraction):
    w = torch.randn(4 * 16, 64)
    r = int(16 * rotary_fraction)
    there = permute_qk(w, 4, 16, r, to="half")
    assert not torch.equal(there, w)
    assert torch.equal(permute_qk(there, 4, 16, r, to="interleaved"), w)


def test_permuted_checkpoint_computes_the_same_logits():
    """A model in the interleaved layout and its q/k-permuted copy in the half layout agree."""
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                      rope_layout="interleaved", partial_rotary_factor=0.5)
    a = Decoder(cfg).eval()
    b = Decoder(cfg.replace(rope_layout="half")).eval()
    state = a.state_dict()
    for name in list(state):
        if name.endswith("attn.wq.weight"):
            state[name] = permute_qk(state[name], 4, 8, cfg.rotary_dim, to="half")
        if name.endswith("attn.wk.weight"):
            state[name] = permute_qk(state[name], 2, 8, cfg.rotary_dim, to="half")
    b.load_state_dict(state)
    ids = torch.randint(0, 50, (1, 20))
    pos = 100 + 9 * torch.arange(20)[None]
    with torch.no_grad():
        assert (a(ids, pos) - b(ids, pos)).abs().max().item() < 1e-5


def test_first_pair_turns_one_radian_per_token():
    cfg = _cfg(head_dim=128, n_heads=1, d_model=128)
    cos, sin = rope_cos_sin(cfg, torch.tensor([[1]]), torch.float64)
    assert math.isclose(math.atan2(sin[0, 0, 0].item(), cos[0, 0, 0].item()), 1.0, rel_tol=1e-7)
