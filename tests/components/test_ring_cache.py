"""The ring-buffer cache of sliding-window layers: memory of the window, logits of the full cache.

A windowed layer's buffer has `sliding_window` slots (token i in slot i mod W), a full layer's the
whole cache length; `kv_cache_size` (the calculator) counts the same bytes. Decoding through the
ring equals the full forward pass of the same prefix, float32, to 1e-5, for prefills shorter and
longer than the window, batched with left padding, and with keys cached before rotation.
"""

import pytest
import torch

import llamablock
from llamablock import Decoder, KVCache, ModelConfig
from llamablock.diagnostics.kv_calculator import kv_cache_size

MIXED = dict(vocab_size=61, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=512, sliding_window=5,
             layer_types=["sliding", "full", "sliding", "sliding"])


def _model(**kw):
    torch.manual_seed(0)
    return Decoder(ModelConfig(**{**MIXED, **kw})).eval()


def test_the_ring_holds_exactly_the_window_and_the_calculator_agrees():
    cfg = ModelConfig(**MIXED)
    cache = KVCache(cfg, batch_size=3, max_len=256)
    assert [k.shape[2] for k in cache.keys] == [5, 256, 5, 5]
    calc = kv_cache_size(cfg, tokens=256, batch=3, dtype="float32")
    assert calc.total_bytes == cache.nbytes()
    assert cache.nbytes() == 2 * 3 * 2 * 8 * 4 * (3 * 5 + 256)  # K and V x batch x n_kv x hd x float32 x slots


def test_a_cache_no_longer_than_the_window_needs_no_ring():
    cache = KVCache(ModelConfig(**MIXED), batch_size=1, max_len=4)
    assert cache.ring is None and [k.shape[2] for k in cache.keys] == [4] * 4


@pytest.mark.parametrize("prefill", [1, 3, 5, 12])
@pytest.mark.parametrize("late", [False, True], ids=["rope", "dynamic-late-keys"])
def test_decoding_through_the_ring_equals_the_full_forward(prefill, late):
    """Late keys: dynamic-consistent NTK's frequencies change past 16 tokens, so the ring holds keys before
    rotation and their positions come from the slots; one layer, since above the first the
    cached values keep the old frequencies (rope_scaling.rotates_cached_keys)."""
    late_kw = dict(rope_scaling={"rope_type": "dynamic-consistent", "factor": 4.0}, max_seq_len=16, n_layers=1,
                   layer_types=["sliding"])
    model = _model(**(late_kw if late else {}))
    ids = torch.randint(0, 61, (2, 30))
    cache = KVCache(model.cfg, batch_size=2, max_len=30)
    with torch.no_grad():
        model(ids[:, :prefill], cache=cache)
        for i in range(prefill, 30):
            step = model(ids[:, i: i + 1], cache=cache)[:, -1]
            assert (step - model(ids[:, : i + 1])[:, -1]).abs().max().item() <= 1e-5, i
    assert cache.length == 30 and cache.keys[0].shape[2] == 5


@torch.no_grad()
def _greedy_left_padded(model, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Greedy tokens of prompts left-padded into one KVCache (its sliding layers a ring): `pad_mask`
    hides the padding and position_ids count each row's real tokens."""
    b, width = len(prompts), max(map(len, prompts))
    ids = torch.zeros(b, width, dtype=torch.long)  # (b, width), left-padded
    real = torch.zeros(b, width + new, dtype=torch.bool)  # True on real tokens, by cache slot
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        real[i, width - len(p): width] = True
    cache = KVCache(model.cfg, b, width + new)
    positions = (real[:, :width].cumsum(1) - 1).clamp(min=0)  # (b, width)
    logits = model(ids, position_ids=positions, cache=cache, pad_mask=real[:, :width])[:, -1]
    pos, out = real[:, :width].sum(1, keepdim=True), [[] for _ in prompts]  # pos (b, 1)
    for step in range(new):
        tok = logits.argmax(-1)  # (b,)
        for i in range(b):
            out[i].append(int(tok[i]))
        if step == new - 1:
            break
        real[:, width + step] = True
        logits = model(tok[:, None], position_ids=pos, cache=cache, pad_mask=real[:, : width + step + 1])[:, -1]
        pos = pos + 1
    return out


def test_batched_left_padded_generation_through_the_ring_equals_one_prompt_at_a_time():
    model = _model()
    prompts = [[3, 4, 5, 6, 7, 8, 9, 10], [11, 12]]
    batched = _greedy_left_padded(model, prompts, 12)
    single = [_greedy_left_padded(model, [p], 12)[0] for p in prompts]
    assert batched == single


def test_save_and_reload_keeps_the_layer_kinds(tmp_path):
    ours = _model(family="gemma2", sandwich_norm=True, norm_offset=1.0, query_pre_attn_scalar=12.0, embed_scale=32**0.5,
                  attn_softcap=4.0, final_softcap=6.0, ffn="geglu", tie_embeddings=True)
    llamablock.save_pretrained(ours, tmp_path)
    back = llamablock.load_pretrained(tmp_path)
    assert back.cfg.layer_kinds == ours.cfg.layer_kinds and back.cfg.attn_softcap == 4.0
    ids = torch.randint(0, 61, (1, 20))
    with torch.no_grad():
        assert torch.equal(back(ids), ours(ids))
