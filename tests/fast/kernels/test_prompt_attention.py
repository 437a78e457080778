"""A prompt's causal attention in chunks of queries (fast/kernels/prompt_attention.py), and the eager engine that uses it.

Reference, independent of the code under test: float64 attention, each query over the keys up to its
own position. The bound, from float32's unit u = 2^-24 and Higham's gamma_n = n u / (1 - n u) for a
sum of n terms (Accuracy and Stability of Numerical Algorithms, 3.1), as tests/fast/kernels/
test_cache_attention.py derives it: a score is q scaled (one rounding) dotted with k over hd terms,
off by at most s = scale gamma_(hd+1) max sum |q| |k|; that moves the softmax's weights by at most a
factor e^(2s), the output by (e^(2s) - 1) max |v|, and torch's softmax rounds each weight by a few u
more (4 u max |v|); the weighted sum of at most t values adds gamma_t max |v| (the weights sum to 1).
torch's scaled_dot_product_attention, the path the chunks replace, is held to the same bound: the
bound is what float32 attention keeps, not a tolerance fitted to the chunks.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from llamablock.attention import Attention
from llamablock.config import ModelConfig
from llamablock.fast.kernels import prompt_attention
from llamablock.fast.kernels.prompt_attention import CHUNK, FROM, UP_TO, PromptReader, chunked_causal
from llamablock.model import Decoder
from llamablock.runtime.engine import EagerEngine

U = 2.0**-24
# (batch, kv heads, queries a group, head width, tokens): MHA, the 1B bench shape, SmolLM2's group of 3,
# MQA; one token, a chunk less one, a chunk and one more, several chunks and a part
SHAPES = [(1, 4, 1, 16, 33), (1, 8, 4, 64, 300), (2, 3, 3, 64, 31), (1, 1, 8, 32, 1), (1, 2, 2, 128, 2 * CHUNK + 7)]


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _case(b, n_kv, g, hd, t, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n_kv * g, t, hd, generator=gen), torch.randn(b, n_kv, t, hd, generator=gen),
            torch.randn(b, n_kv, t, hd, generator=gen))


def _exact_and_bound(q, k, v, scale):
    b, h, t, hd = q.shape
    g = h // k.shape[1]
    kd, vd = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)  # (b, h, t, hd)
    scores = q.double() @ kd.transpose(-1, -2) * scale
    scores.masked_fill_(torch.ones(t, t, dtype=torch.bool).triu_(1), float("-inf"))
    exact = torch.softmax(scores, -1) @ vd
    s = scale * gamma(hd + 1) * (q.double().abs() @ kd.abs().transpose(-1, -2)).max().item()
    return exact, (math.expm1(2 * s) + 4 * U + gamma(t)) * vd.abs().max().item()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_chunks_compute_float64_causal_attention_within_float32_s_bound(shape):
    q, k, v = _case(*shape)
    scale = shape[3] ** -0.5
    exact, bound = _exact_and_bound(q, k, v, scale)
    got = chunked_causal(q, k, v, scale)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert got.shape == q.shape and got.dtype == torch.float32
    errs = [(x.double() - exact).abs().max().item() for x in (got, sdpa)]
    print(f"{shape}: chunks {errs[0]:.2g}, SDPA {errs[1]:.2g}, bound {bound:.2g}")
    assert max(errs) <= bound, (errs, bound)


def test_a_query_never_reads_a_later_key_or_value():
    """Keys and values from slot p on changed (to large finite values): every output before p is the
    same, bit for bit, so no weight reaches them, not even a rounded-off one."""
    q, k, v = _case(1, 2, 3, 32, 3 * CHUNK)
    want = chunked_causal(q, k, v, 0.125)
    for p in (5, CHUNK, CHUNK + 1, 2 * CHUNK + 9):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, p:], v2[:, :, p:] = 1e4, -1e4
        got = chunked_causal(q, k2, v2, 0.125)
        assert torch.equal(got[:, :, :p], want[:, :, :p]), p
        assert not torch.equal(got[:, :, p:], want[:, :, p:])  # the changed slots are read from p on


@pytest.mark.parametrize("t, dtype, grad, keys, covered", [
    (FROM, torch.float32, False, 0, True), (UP_TO, torch.float32, False, 0, True),
    (FROM - 1, torch.float32, False, 0, False), (UP_TO + 1, torch.float32, False, 0, False),
    (FROM, torch.bfloat16, False, 0, False),  # its softmax would run in bfloat16
    (FROM, torch.float32, True, 0, False),  # a training step: SDPA's backward
    (FROM, torch.float32, False, 3, False),  # more keys than queries: not a prompt from the cache's start
])
def test_covers_a_float32_prompt_in_its_range_only(t, dtype, grad, keys, covered):
    q, k = torch.zeros(1, 4, t, 16, dtype=dtype), torch.zeros(1, 2, t + keys, 16, dtype=dtype)
    with torch.set_grad_enabled(grad):
        assert PromptReader().covers(q, k) is covered


def _model():
    cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=2048)
    torch.manual_seed(0)
    return Decoder(cfg).eval()


class _Counting(PromptReader):
    calls = 0

    def __call__(self, *args):
        type(self).calls += 1
        return super().__call__(*args)


@torch.inference_mode()
def test_the_eager_engine_prefills_through_the_chunks_where_they_cover_the_prompt():
    """A prompt in the range goes through the reader in every layer, and the logits are SDPA's to
    float32 rounding through two layers (1e-5 of their scale: the bound above is about 1e-6 a layer);
    a shorter prompt runs the layer's own SDPA, bit for bit."""
    model = _model()
    ids = torch.randint(0, 256, (1, FROM + 5), generator=torch.Generator().manual_seed(1))

    def prefill(x):
        engine = EagerEngine(model)
        engine.prepare(x.shape[1] + 1)
        return engine.prefill(x)

    want = [prefill(x) for x in (ids, ids[:, :40])]
    prompt_attention.attach(model)
    assert {type(m.prompt_reader) for m in model.modules() if isinstance(m, Attention)} == {PromptReader}
    for m in model.modules():
        if isinstance(m, Attention):
            m.prompt_reader = _Counting()
    _Counting.calls = 0
    got = prefill(ids)
    assert _Counting.calls == 2
    err, scale = (got - want[0]).abs().max().item(), want[0].abs().max().item()
    assert err <= 1e-5 * scale, (err, scale)
    _Counting.calls = 0
    assert torch.equal(prefill(ids[:, :40]), want[1]) and _Counting.calls == 0


def _tiny_gguf(tmp_path, max_len=512):
    from gguf_tiny import write_tiny_gguf
    from hf_reference import tiny_hf_model

    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16,
                                     max_position_embeddings=max_len), qtype="Q4_1")
    return f


def test_the_plan_gives_the_eager_engine_s_layers_the_reader(tmp_path):
    from llamablock.fast.plan import build, decide
    from llamablock.io.source import open_source

    source = open_source(_tiny_gguf(tmp_path), tokenizer=False)
    model = build(source, decide(source, "auto", "eager")).model
    assert all(isinstance(m.prompt_reader, PromptReader) for m in model.modules() if isinstance(m, Attention))


@torch.inference_mode()
def test_the_operator_computes_what_the_eager_chunks_do():
    """torch.ops.llamablock.prompt_attention (block_op.cpp, what the compiled prefill calls): the same ATen
    calls as chunked_causal for a prompt in FROM..UP_TO, so the same bits; outside it, SDPA's bits."""
    from llamablock.fast.kernels import block_op

    assert block_op.load(), block_op.why_not()
    for t in (FROM, FROM + 37, FROM - 1, UP_TO + 1):
        q, k, v = _case(2, 2, 3, 16, t, seed=t)
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # (b, h, t, hd) viewed from (b, t, h, hd), as layers make it
        got = torch.ops.llamablock.prompt_attention(q, k, v, 0.25, CHUNK, FROM, UP_TO)
        want = chunked_causal(q, k, v, 0.25) if FROM <= t <= UP_TO else \
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.25)
        assert got.is_contiguous() and torch.equal(got, want), t
    torch.library.opcheck(torch.ops.llamablock.prompt_attention, (q, k, v, 0.25, CHUNK, FROM, UP_TO))


def test_the_static_layout_prefills_through_the_operator_as_the_eager_engine_does(tmp_path):
    """Over a file's blocks, the static layout (what the compiled engine compiles, run eagerly here) calls
    the operator, which takes the chunks for this prompt (torch.profiler sees its matmuls, not SDPA's
    kernel), and the eager engine the Python chunks: the same logits, bit for bit, along the prompt and
    its steps."""
    from kv16_bound import logits_along
    from torch.profiler import profile

    from llamablock.fast.compiled.static_engine import StaticEngine
    from llamablock.fast.kernels import cache_attention
    from llamablock.fast.plan import load_gguf_native

    model = load_gguf_native(_tiny_gguf(tmp_path), engine="compiled")[0].eval()
    ids = torch.randint(0, model.cfg.vocab_size, (1, FROM + 8), generator=torch.Generator().manual_seed(5))
    eager = EagerEngine(model, kv_dtype=torch.float16)
    assert cache_attention.attach(model)
    prompt_attention.attach(model)
    static = StaticEngine(model, "blocks", kv_dtype=torch.float16)
    assert static.in_place
    with torch.no_grad():
        with profile() as prof:
            got = logits_along(static, ids, FROM + 3)
        assert torch.equal(got, logits_along(eager, ids, FROM + 3))
    names = {e.name for e in prof.events()}
    assert "llamablock::prompt_attention" in names and not any("flash_attention" in n for n in names)
