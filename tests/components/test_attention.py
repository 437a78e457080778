"""Grouped-query attention (section 15.5): GQA with n_kv = n_heads is MHA, bit for bit; the cache
holds only the key-value heads; sliding window and ALiBi masks against explicit references."""

import pytest
import torch
import torch.nn.functional as F

from llamablock import Decoder, KVCache, ModelConfig, attention, kv_cache
from llamablock.alibi import alibi_slopes
from llamablock.attention import Attention, attention_inputs


def _cfg(**kw):
    return ModelConfig(**{**dict(vocab_size=50, d_model=32, n_layers=1, n_heads=4, head_dim=8,
                                 position="none"), **kw})


def _textbook_mha(attn: Attention, x: torch.Tensor, scores_fn) -> torch.Tensor:
    """Multi-head attention as section 6.6 writes it: per-head q, k, v from the same weights."""
    b, t, _ = x.shape
    h, d = attn.h, attn.hd
    q = attn.wq(x).view(b, t, h, d).transpose(1, 2)
    k = attn.wk(x).view(b, t, h, d).transpose(1, 2)
    v = attn.wv(x).view(b, t, h, d).transpose(1, 2)
    out = scores_fn(q, k, v)  # (b, h, t_out, d)
    return attn.wo(out.transpose(1, 2).reshape(b, out.shape[2], h * d))


def test_gqa_with_one_query_per_group_is_mha_bit_for_bit_prefill():
    attn = Attention(_cfg(n_kv_heads=4))
    x = torch.randn(2, 9, 32)
    pos = torch.arange(9).expand(2, 9)
    ref = _textbook_mha(attn, x, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert (attn(x, attention_inputs(pos, 0, dtype=x.dtype)) - ref).abs().max().item() == 0.0


def test_gqa_with_one_query_per_group_is_mha_bit_for_bit_decode():
    cfg = _cfg(n_kv_heads=4)
    attn = Attention(cfg)
    x = torch.randn(1, 6, 32)

    def heads(y):  # (1, t, 32) -> (1, 4, t, 8)
        return y.view(1, -1, 4, 8).transpose(1, 2)

    # The same projection calls on both sides (a Linear over 5 rows and over 1 row), so only
    # the attention arithmetic is compared.
    k_old, v_old = heads(attn.wk(x[:, :5])), heads(attn.wv(x[:, :5]))
    cache = KVCache(cfg, 1, 8)
    cache.update(0, k_old, v_old)
    cache.advance(5)
    got = attn(x[:, 5:], attention_inputs(torch.tensor([[5]]), 5, dtype=x.dtype), cache)

    # Textbook MHA for the newest token: each head's query against all its keys.
    q = heads(attn.wq(x[:, 5:]))
    k = torch.cat([k_old, heads(attn.wk(x[:, 5:]))], 2)
    v = torch.cat([v_old, heads(attn.wv(x[:, 5:]))], 2)
    out = torch.softmax((q @ k.transpose(-1, -2)) * 8**-0.5, -1) @ v  # (1, 4, 1, 8)
    ref = attn.wo(out.transpose(1, 2).reshape(1, 1, 32))
    assert (got - ref).abs().max().item() == 0.0


def test_cache_holds_only_kv_heads():
    cfg = _cfg(n_layers=3, n_heads=8, n_kv_heads=2, d_model=64)
    cache = KVCache(cfg, batch_size=2, max_len=100, dtype=torch.float16)
    assert cache.keys[0].shape == (2, 2, 100, 8)
    assert cache.nbytes() == 2 * 3 * 2 * 8 * 100 * 2 * 2 == 2 * cfg.kv_bytes_per_token(2) * 100


def _reference_masked(cfg, model, ids, allowed, bias=None):
    """Run the one-layer model's attention with an explicit mask, from the same weights."""
    attn = model.layers[0].attn
    x = model.layers[0].norm1(model.embed(ids))
    b, t, _ = x.shape
    g = cfg.n_heads // cfg.n_kv_heads
    q = attn.wq(x).view(b, t, cfg.n_heads, 8).transpose(1, 2)
    k = attn.wk(x).view(b, t, cfg.n_kv_heads, 8).transpose(1, 2).repeat_interleave(g, 1)
    v = attn.wv(x).view(b, t, cfg.n_kv_heads, 8).transpose(1, 2).repeat_interleave(g, 1)
    scores = q @ k.transpose(-1, -2) / 8**0.5
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed, float("-inf"))
    return attn.wo((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, -1))


def test_sliding_window_keeps_the_last_w_tokens():
    cfg = _cfg(n_kv_heads=2, sliding_window=3)
    model = Decoder(cfg)
    ids = torch.randint(0, 50, (1, 10))
    i, j = torch.arange(10)[:, None], torch.arange(10)[None]
    ref = _reference_masked(cfg, model, ids, (j <= i) & (i - j < 3))
    attn = model.layers[0].attn
    x = model.layers[0].norm1(model.embed(ids))
    got = attn(x, model.attention_inputs(torch.arange(10)[None]))
    assert (got - ref).abs().max().item() < 1e-6


def test_alibi_bias_matches_explicit_distance_penalty():
    cfg = _cfg(n_kv_heads=1, position="alibi")
    model = Decoder(cfg)
    ids = torch.randint(0, 50, (1, 7))
    i, j = torch.arange(7)[:, None], torch.arange(7)[None]
    bias = -alibi_slopes(4)[:, None, None] * (i - j)  # m * [-(i-1), ..., -1, 0], Press et al.
    ref = _reference_masked(cfg, model, ids, j <= i, bias)
    x = model.layers[0].norm1(model.embed(ids))
    got = model.layers[0].attn(x, model.attention_inputs(torch.arange(7)[None]))
    assert (got - ref).abs().max().item() < 1e-6


def test_every_position_scheme_caches_consistently():
    for position in ("rope", "alibi", "learned", "sinusoidal", "none"):
        cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, position=position,
                          max_seq_len=32, norm="layernorm", norm_placement="post", ffn="gelu")
        model = Decoder(cfg).eval()
        ids = torch.randint(0, 50, (2, 12))
        with torch.no_grad():
            full = model(ids)
            cache = KVCache(cfg, 2, 16)
            steps = [model(ids[:, :4], cache=cache)] + [model(ids[:, i:i + 1], cache=cache) for i in range(4, 12)]
        assert (torch.cat(steps, 1) - full).abs().max().item() < 1e-5, position


def _decode_bf16(cfg, ids, pad_mask=None, stale=False):
    """Prefill 3 tokens, then decode the rest one at a time, in bfloat16; every step's logits."""
    torch.manual_seed(0)
    model = Decoder(cfg).to(torch.bfloat16).eval()
    b, n = ids.shape
    cache = KVCache(cfg, b, n, dtype=torch.bfloat16)
    if stale:  # an older sequence's keys and values past `length`, as after KVCache.reset
        for buf in cache.keys + cache.values:
            buf.normal_()
    pos = None if pad_mask is None else (pad_mask.cumsum(1) - 1).clamp(min=0)
    steps = []
    with torch.no_grad():
        for a, z in [(0, 3)] + [(i, i + 1) for i in range(3, n)]:
            kw = {} if pad_mask is None else dict(position_ids=pos[:, a:z], pad_mask=pad_mask[:, :z])
            steps.append(model(ids[:, a:z], cache=cache, **kw)[:, -1])
    return torch.stack(steps)


@pytest.mark.parametrize("case", ["gqa", "stale", "padded-batch", "alibi", "ring", "softcap"])
def test_bfloat16_decode_padded_to_key_buckets_is_bit_for_bit_unpadded(monkeypatch, case):
    """Decode steps pad their keys to KEY_BUCKET slots (KVCache.bucketed) so that oneDNN
    builds a bounded set of kernels; the padding's weight is exactly 0, so every step's logits
    equal the unpadded ones (KEY_BUCKET = 1) bit for bit, over several buckets, whatever the
    unfilled slots hold, with each kind of mask a decode step can carry."""
    kw = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, max_seq_len=64)
    kw |= {"alibi": dict(position="alibi"), "softcap": dict(attn_softcap=5.0),
           "ring": dict(sliding_window=16, layer_types=["sliding", "full"])}.get(case, {})
    cfg = ModelConfig(**kw)
    ids = torch.randint(0, 50, (2 if case == "padded-batch" else 1, 21))
    pad_mask = None
    if case == "padded-batch":  # the second row left-padded by 2, as generate_batch does
        pad_mask = torch.ones(ids.shape, dtype=torch.bool)
        pad_mask[1, :2] = False
    seen = []
    real_attend = attention.Attention.attend
    monkeypatch.setattr(attention.Attention, "attend",
                        lambda self, q, k, v, inputs, keys=None: seen.append((k.shape[2], keys))
                        or real_attend(self, q, k, v, inputs, keys))
    monkeypatch.setattr(kv_cache, "KEY_BUCKET", 8)
    padded = _decode_bf16(cfg, ids, pad_mask, stale=case == "stale")
    assert {(8, 4), (16, 9), (21, 17)} <= set(seen)  # buckets crossed; the last cut to the cache's 21
    monkeypatch.setattr(kv_cache, "KEY_BUCKET", 1)
    assert torch.equal(padded, _decode_bf16(cfg, ids, pad_mask, stale=case == "stale"))
