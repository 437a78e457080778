"""Context extension on a checkpoint (studies/context_extension.py): per-token losses under each
RoPE method equal transformers' with the same rope_scaling, past the original length and at an
offset; the chunked head equals one pass; Self-Extend with group 1 and sinks with a window longer
than the text equal the plain model, and sinks with a short window equal the plain model run on
the tokens a StreamingLLM cache would hold.

Tiny llamas (tests/hf_reference.py) trained context 16, run at 48 tokens (factor 3). Tolerance
1e-4 nats in float32, the issue's bound for logits.
"""

import pytest
import torch
import torch.nn.functional as F
from hf_reference import tiny_hf_model

import llamablock
from llamablock.runtime.evaluate import token_losses
from llamablock.studies.context_extension import (
    method_losses,
    rope_scaling_for,
    with_rope_scaling,
)
from llamablock.studies.grouped_attention import (
    SelfExtend,
    Sinks,
    with_grouped_attention,
)

L, N, HEAD_DIM = 16, 48, 16


def _longrope():
    return {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0 + 5.0 * i / 7 for i in range(8)],
            "factor": 3.0, "original_max_position_embeddings": L}


# What each named method of `rope eval` means at factor N / L = 3 from L = 16, written out here
# (transformers' keys; llama3's band is Llama 3.1's published low 1, high 4).
NAMED = {
    "linear": {"rope_type": "linear", "factor": 3.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "dynamic-consistent": {"rope_type": "dynamic-consistent", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": L},
    "yarn-no-factor": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": L,
                       "attention_factor": 1.0},
    "llama3": {"rope_type": "llama3", "factor": 3.0, "original_max_position_embeddings": L,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}
SCALINGS = {**NAMED, "longrope": _longrope()}


def _theirs(scaling):
    """transformers' type for a method: dynamic-consistent is its dynamic with the cache read otherwise."""
    return {**scaling, "rope_type": "dynamic"} if scaling["rope_type"] == "dynamic-consistent" else scaling


def _hf(tmp_path, scaling=None, **kw):
    params = {"rope_theta": 10000.0, **(scaling or {"rope_type": "default"})}
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, head_dim=HEAD_DIM, max_position_embeddings=L,
                       rope_parameters=params, **kw)
    hf.save_pretrained(tmp_path)
    return hf


def _hf_losses(hf, ids, pos):
    with torch.no_grad():
        logits = hf(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits[0, :-1]
    return F.cross_entropy(logits.float(), ids[0, 1:], reduction="none")


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_method_losses_equal_transformers_past_the_context_and_at_an_offset(tmp_path, name):
    _hf(tmp_path / "plain")
    base = llamablock.load_pretrained(tmp_path / "plain")  # the checkpoint, unscaled
    ours = with_rope_scaling(base, SCALINGS[name])  # the same weights, the method on top
    ids = torch.randint(0, 97, (1, N))
    for start in (0, 3000):  # from the start, and far past the context (length-dependent types follow it)
        pos = start + torch.arange(N)[None]
        got = token_losses(ours, ids, position_ids=pos, chunk=7)
        # A fresh transformers model each time (its dynamic type keeps the largest length seen);
        # the same seed gives it the same weights, with transformers' own scaling.
        hf = _hf(tmp_path / f"hf{start}", _theirs(SCALINGS[name]))
        assert (got - _hf_losses(hf, ids, pos)).abs().max() <= 1e-4


@pytest.mark.parametrize("name", sorted(NAMED))
def test_each_named_method_is_its_scaling(name):
    assert rope_scaling_for(name, N / L, L) == NAMED[name]


def test_named_methods_reach_the_same_losses_as_their_scaling(tmp_path):
    _hf(tmp_path)
    base = llamablock.load_pretrained(tmp_path)
    ids = torch.randint(0, 97, (1, N))
    hf = _hf(tmp_path / "yarn", SCALINGS["yarn"])
    assert (method_losses(base, ids, "yarn", N / L) - _hf_losses(hf, ids, torch.arange(N)[None])).abs().max() <= 1e-4
    plain = _hf_losses(_hf(tmp_path / "none"), ids, torch.arange(N)[None])
    assert (method_losses(base, ids, "none", N / L) - plain).abs().max() <= 1e-4


def test_chunked_head_equals_one_pass(tmp_path):
    _hf(tmp_path)
    model = llamablock.load_pretrained(tmp_path)
    ids = torch.randint(0, 97, (1, N))
    with torch.no_grad():
        whole = F.cross_entropy(model(ids)[0, :-1], ids[0, 1:], reduction="none")
    for chunk in (1, 5, 1024):
        assert (token_losses(model, ids, chunk=chunk) - whole).abs().max() <= 1e-6


def test_self_extend_with_group_one_and_sinks_with_a_long_window_are_the_plain_model(tmp_path):
    _hf(tmp_path)
    model = llamablock.load_pretrained(tmp_path)
    ids = torch.randint(0, 97, (1, N))
    plain = token_losses(model, ids)
    for scheme in (SelfExtend(group=1, window=4), Sinks(sinks=4, window=N)):
        got = token_losses(with_grouped_attention(model, scheme, block=5), ids)
        assert (got - plain).abs().max() <= 1e-5
    # and they do change something when they bite; query blocks of 5 give what one block gives
    for scheme in (SelfExtend(group=3, window=4), Sinks(sinks=2, window=7)):
        one = token_losses(with_grouped_attention(model, scheme, block=N), ids)
        assert (one - plain).abs().max() > 1e-3
        assert (token_losses(with_grouped_attention(model, scheme, block=5), ids) - one).abs().max() <= 1e-5


@pytest.mark.parametrize("kind", ["dynamic", "dynamic-consistent"])
def test_grouped_attention_refuses_rope_that_follows_the_length(tmp_path, kind):
    _hf(tmp_path)
    model = with_rope_scaling(llamablock.load_pretrained(tmp_path), {"rope_type": kind, "factor": 3.0})
    from llamablock.studies.grouped_attention import GroupedAttention

    with pytest.raises(ValueError, match="length-dependent"):  # its rotations take no length
        GroupedAttention(model.layers[0].attn, Sinks(sinks=2, window=7))


def _by_definition(attn, scheme, x):
    """One attention layer on x (1, t, D) with every (query, key) score written out as grouped_attention's
    docstring defines it, on whole (t, t) matrices: the reference for the banded blocks."""
    t = x.shape[1]
    q = attn.wq(x).view(1, t, attn.h, attn.hd).transpose(1, 2)  # (1, h, t, hd)
    k = attn.wk(x).view(1, t, attn.n_kv, attn.hd).transpose(1, 2).repeat_interleave(attn.h // attn.n_kv, 1)
    v = attn.wv(x).view(1, t, attn.n_kv, attn.hd).transpose(1, 2).repeat_interleave(attn.h // attn.n_kv, 1)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    d = i - j
    if isinstance(scheme, SelfExtend):  # Jin et al. 2024: floor-divided positions past the neighbour window
        G, W = scheme.group, scheme.window
        pq, pk, grouped, seen = torch.arange(t) // G + W - W // G, torch.arange(t) // G, d >= W, d >= 0
    else:  # StreamingLLM: the sinks at their own positions, the query at its slot in a cache of S + W
        S, W = scheme.sinks, scheme.window
        pq, pk = torch.arange(t).clamp(max=S + W - 1), torch.arange(t)
        grouped = (d >= W) & (j < S)
        seen = ((d >= 0) & (d < W)) | grouped

    def rot(z, p):
        return attn.rotary.rotate(z, *attn.rotary.cos_sin(p[None], z.dtype))

    plain = rot(q, torch.arange(t)) @ rot(k, torch.arange(t)).transpose(-1, -2)
    moved = rot(q, pq) @ rot(k, pk).transpose(-1, -2)
    scores = torch.where(grouped, moved, plain).mul(attn.scale).masked_fill(~seen, float("-inf"))
    out = torch.softmax(scores, -1) @ v  # (1, h, t, hd)
    return attn.wo(out.transpose(1, 2).reshape(1, t, attn.h * attn.hd))


@pytest.mark.parametrize("scheme", [SelfExtend(group=3, window=7), SelfExtend(group=2, window=1),
                                    Sinks(sinks=2, window=9), Sinks(sinks=0, window=5), Sinks(sinks=4, window=3)])
def test_grouped_attention_in_banded_blocks_equals_its_definition(tmp_path, scheme):
    """Blocks smaller and larger than the window, and a last block cut short, against whole matrices."""
    from llamablock.studies.grouped_attention import GroupedAttention

    _hf(tmp_path)
    attn = llamablock.load_pretrained(tmp_path).layers[0].attn
    x = torch.randn(1, N, 64)
    with torch.no_grad():
        want = _by_definition(attn, scheme, x)
        for block in (1, 5, 11, N):
            got = GroupedAttention(attn, scheme, block)(x, None)
            assert (got - want).abs().max() <= 1e-5, (block, (got - want).abs().max())


def test_sinks_equal_the_plain_model_on_what_a_streaming_cache_holds(tmp_path):
    """One layer: a query's keys are then the embeddings of the tokens the cache holds, so the
    StreamingLLM cache (S sinks then the last W tokens, rotated by slot) is the plain model run on
    exactly those tokens at positions 0..S+W-1; its last loss is the sinks model's loss there."""
    _hf(tmp_path, num_hidden_layers=1)
    model = llamablock.load_pretrained(tmp_path)
    ids = torch.randint(0, 97, (1, N))
    S, W = 2, 9
    got = token_losses(with_grouped_attention(model, Sinks(sinks=S, window=W), block=4), ids)
    for i in (W + S - 1, 20, N - 2):  # loss i predicts token i + 1 from the cache after token i
        kept = torch.cat((ids[:, :S], ids[:, i - W + 1:i + 1], ids[:, i + 1:i + 2]), dim=1)
        assert abs(token_losses(model, kept)[-1] - got[i]) <= 1e-5


def test_every_rope_method_runs_on_sdpas_causal_path(tmp_path, monkeypatch):
    """Bounded memory: each layer of each RoPE method's pass calls SDPA with is_causal and no mask
    tensor (its CPU kernel attends in blocks), never the path that builds (t, s) masks and scores."""
    from llamablock.studies.context_extension import GROWING, ROPE_METHODS, method_model

    _hf(tmp_path)
    model = llamablock.load_pretrained(tmp_path)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append((kw.get("is_causal"), kw.get("attn_mask"))) or sdpa(*a, **kw))
    ids = torch.randint(0, 97, (1, N))
    for method in ROPE_METHODS:
        if method in GROWING:
            continue  # read a piece at a time after a cache (growing_token_losses): (step, n) scores
        calls.clear()
        token_losses(method_model(model, method, N / L, N), ids)
        assert calls == [(True, None)] * model.cfg.n_layers, method


def test_dynamic_losses_equal_transformers_cached_generation(tmp_path, monkeypatch):
    """rope eval's dynamic, a piece at a time (pieces of 5 here, DYNAMIC_STEP in use), equals
    transformers run the same way: the first L tokens in one pass, then pieces of 5 over its cache,
    position ids given, per token past L to 1e-4. dynamic-consistent is another method there."""
    from llamablock.studies import context_extension

    monkeypatch.setattr(context_extension, "DYNAMIC_STEP", 5)
    _hf(tmp_path / "plain")
    base = llamablock.load_pretrained(tmp_path / "plain")
    ids = torch.randint(0, 97, (1, N))
    hf, cache, want, a = _hf(tmp_path / "hf", NAMED["dynamic"]), None, [], 0
    with torch.no_grad():
        while a < N - 1:
            b = min(a + (L if a == 0 else 5), N - 1)
            r = hf(input_ids=ids[:, a:b], position_ids=torch.arange(a, b)[None], cache=cache, use_cache=True)
            cache = r.past_key_values
            want.append(F.cross_entropy(r.logits[0].float(), ids[0, a + 1:b + 1], reduction="none"))
            a = b
    want = torch.cat(want)
    assert (method_losses(base, ids, "dynamic", N / L, chunk=7) - want).abs().max() <= 1e-4
    other = method_losses(base, ids, "dynamic-consistent", N / L)
    assert (other[:L] - want[:L]).abs().max() <= 1e-4 and (other[L:] - want[L:]).abs().max() > 1e-2


def test_growing_losses_step_one_equal_transformers_prefix_by_prefix(tmp_path):
    """dynamic-consistent as a generation sees it: loss i from transformers' uncached forward of the
    prefix 0..i alone (its frequencies follow that prefix's length). One layer, so that a cache of
    keys kept before rotation can equal the full forward (rope_scaling.rotates_cached_keys says why)."""
    from llamablock.runtime.evaluate import growing_token_losses

    _hf(tmp_path / "plain", num_hidden_layers=1)
    ours = with_rope_scaling(llamablock.load_pretrained(tmp_path / "plain"), NAMED["dynamic-consistent"])
    ids = torch.randint(0, 97, (1, 30))
    got = growing_token_losses(ours, ids, first=10, step=1)
    want = []
    hf = _hf(tmp_path / "hf", NAMED["dynamic"], num_hidden_layers=1)
    for i in range(29):  # increasing lengths only: transformers' dynamic keeps the largest length seen
        with torch.no_grad():
            logits = hf(input_ids=ids[:, :i + 1], use_cache=False).logits[0, -1]
        want.append(F.cross_entropy(logits[None], ids[0, i + 1:i + 2]))
    assert (got - torch.stack(want)).abs().max() <= 1e-4


def test_growing_losses_equal_one_pass_where_frequencies_do_not_follow_the_length(tmp_path):
    from llamablock.runtime.evaluate import growing_token_losses

    _hf(tmp_path)
    model = with_rope_scaling(llamablock.load_pretrained(tmp_path), NAMED["yarn"])
    ids = torch.randint(0, 97, (1, N))
    for first, step in ((16, 5), (1, 47), (30, 1)):
        assert (growing_token_losses(model, ids, first, step, chunk=3) - token_losses(model, ids)).abs().max() <= 1e-5
