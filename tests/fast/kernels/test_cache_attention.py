"""A decode step's attention read in place from a 16-bit KV cache (c/cache_attention.c through
fast/kernels/cache_attention.py), and the eager engine that uses it.

Reference, independent of the code under test: float64 attention over the cache's own values (every
float16 and bfloat16 is exactly a float64). The bound, from float32's unit u = 2^-24 and Higham's
gamma_n = n u / (1 - n u) for a sum of n terms (Accuracy and Stability of Numerical Algorithms, 3.1):
  * a score is a dot product of hd terms times the scale: off by at most s = scale gamma_hd sum |q| |k|;
  * scores each off by at most s move the softmax's weights by at most a factor e^(2s) (the sum
    moves too), so the output by at most (e^(2s) - 1) max |v|; torch's float32 softmax rounds each
    weight by a few u more: 4 u max |v| (exp, the sum and the division);
  * the weighted sum of n values in tiles of 64, then the tiles' sums: gamma_(64 + tiles) max |v|
    (the weights sum to 1).
Slots past the n read hold NaN: a read past them would make the output NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_builds import RUNS
from kv16_bound import assert_within_bound, logits_along

from llamablock.attention import Attention
from llamablock.config import ModelConfig
from llamablock.fast.kernels import cache_attention
from llamablock.fast.kernels.cache_attention import read_cache
from llamablock.model import Decoder
from llamablock.runtime.engine import EagerEngine

U = 2.0**-24
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# (kv heads, queries a group, head width, slots read): MHA-like, the 1B bench shape, SmolLM2's group of 3,
# a group of 6 (4 + 2 one at a time), hd 80 and 128, one slot, a tile and one more, MQA
SHAPES = [(8, 4, 64, 300), (3, 3, 64, 65), (2, 6, 128, 1), (4, 5, 80, 129), (1, 8, 16, 64), (2, 1, 64, 7)]


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _case(n_kv, g, hd, n, dtype, seed=0):
    """q (1, h, 1, hd) and a cache of n + 11 slots, slots from n on NaN, as k, v views of its first n."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, n_kv * g, 1, hd, generator=gen)
    k, v = (torch.randn(1, n_kv, n + 11, hd, generator=gen).to(dtype) for _ in range(2))
    k[:, :, n:], v[:, :, n:] = float("nan"), float("nan")
    return q, k[:, :, :n], v[:, :, :n]


def _exact_and_bound(q, k, v, scale):
    n_kv, n, hd = k.shape[1], k.shape[2], k.shape[3]
    g = q.shape[1] // n_kv
    qd, kd, vd = q.double().reshape(1, n_kv, g, hd), k.double(), v.double()
    exact = (torch.softmax(qd @ kd.transpose(-1, -2) * scale, -1) @ vd).reshape(q.shape)
    s = scale * gamma(hd) * (qd.abs() @ kd.abs().transpose(-1, -2)).max().item()
    tiles = math.ceil(n / 64)
    return exact, (math.expm1(2 * s) + 4 * U + gamma(64 + tiles)) * vd.abs().max().item()


@pytest.mark.parametrize("isa", RUNS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_build_reads_the_cache_as_float64_attention(isa, dtype, shape, libs):
    q, k, v = _case(*shape, dtype)
    scale = shape[2] ** -0.5
    exact, bound = _exact_and_bound(q, k, v, scale)
    for threads in (1, 2):
        got = read_cache(q, k, v, scale, threads=threads, lib=libs[isa])
        assert got.shape == q.shape and got.dtype == torch.float32
        err = (got.double() - exact).abs().max().item()
        assert err <= bound, (threads, err, bound)


@pytest.mark.parametrize("isa", RUNS)
def test_the_same_bits_whatever_the_threads(isa, libs):
    q, k, v = _case(8, 4, 64, 1000, torch.float16, seed=3)
    one, two = (read_cache(q, k, v, 0.125, threads=t, lib=libs[isa]) for t in (1, 2))
    assert torch.equal(one, two)


@pytest.mark.parametrize("change, message", [
    (lambda q, k, v: (q.bfloat16(), k, v), "one float32 query token"),
    (lambda q, k, v: (q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)), "one sequence"),
    (lambda q, k, v: (q, k, v.float()), "of one dtype"),
    (lambda q, k, v: (q[..., :24].contiguous(), k[..., :24], v[..., :24]), "rows of hd contiguous"),
    (lambda q, k, v: (q[..., :24].contiguous(), k[..., :24].contiguous(), v[..., :24].contiguous()),
     "multiple of 16 features"),
])
def test_what_it_does_not_take_is_refused_with_the_reason(change, message):
    q, k, v = change(*_case(2, 2, 64, 10, torch.float16))
    with pytest.raises(ValueError, match=message):
        read_cache(q, k, v, 0.125)


def _model(window=None):
    cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=256,
                      sliding_window=window)
    torch.manual_seed(0)
    return Decoder(cfg).eval()


class _Counting(cache_attention.CacheReader):
    calls = 0

    def __call__(self, *args):
        type(self).calls += 1
        return super().__call__(*args)


def _readers(model, reader):
    for m in model.modules():
        if isinstance(m, Attention):
            m.cache_reader = reader


@pytest.mark.parametrize("kv", [torch.float16, torch.bfloat16], ids=str)
def test_eager_decode_steps_read_the_cache_in_place_within_its_bound(kv):
    """The steps call the reader (the prefill does not: many tokens), and the logits keep the 16-bit
    cache's bound against a float32 cache (tests/kv16_bound.py), as the upcast reading does."""
    model = _model()
    ids = torch.randint(0, 256, (1, 80), generator=torch.Generator().manual_seed(1))
    want = logits_along(EagerEngine(model), ids, 40)  # float32 cache: the layer's own path
    _Counting.calls = 0
    _readers(model, _Counting())
    got = logits_along(EagerEngine(model, kv_dtype=kv), ids, 40)
    assert _Counting.calls == 2 * 40  # two layers, 40 steps
    assert_within_bound(got, want, kv)


def test_what_the_reader_does_not_cover_runs_the_layer_s_own_code():
    """A float32 cache and a sliding window that masks (a bias): the reader is never called, and
    the logits are the layer's own, bit for bit."""
    for model, kv in ((_model(), torch.float32), (_model(window=16), torch.float16)):
        ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
        want = logits_along(EagerEngine(model, kv_dtype=kv), ids, 20)
        _Counting.calls = 0
        _readers(model, _Counting())
        got = logits_along(EagerEngine(model, kv_dtype=kv), ids, 20)
        assert _Counting.calls == 0 and torch.equal(got, want)


def test_attach_gives_every_attention_layer_one_reader():
    model = _model()
    assert cache_attention.attach(model)
    readers = {id(m.cache_reader) for m in model.modules() if isinstance(m, Attention)}
    assert len(readers) == 1 and None not in readers


def test_the_operator_computes_what_the_ctypes_reader_does():
    """torch.ops.llamablock.cache_attention (block_op.cpp, what compiled steps call) reads the first n of L
    slots: row 0 all of them, equal to read_cache bit for bit (the same C and softmax); row 1 masked
    after its own slot 49, as a batch's shorter row is, within the bound of float64 attention over its
    50 slots (the softmax then sums 70 terms, 20 of them 0, in another grouping than over 50)."""
    from llamablock.fast.kernels import block_op

    assert block_op.load(), block_op.why_not()
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 8, 64, generator=gen)
    k, v = (torch.randn(2, 2, 90, 64, generator=gen).half() for _ in range(2))
    allowed = torch.arange(70)[None, None, None, :] <= torch.tensor([69, 49])[:, None, None, None]  # (2, 1, 1, 70)
    out = torch.ops.llamablock.cache_attention(q, k, v, allowed, 0.125)
    assert out.shape == (2, 8, 64) and out.dtype == torch.float32
    assert torch.equal(out[0], read_cache(q[:1, :, None], k[:1, :, :70], v[:1, :, :70], 0.125)[0, :, 0])
    exact, bound = _exact_and_bound(q[1:, :, None], k[1:, :, :50], v[1:, :, :50], 0.125)
    assert (out[1].double() - exact[0, :, 0]).abs().max().item() <= bound
    torch.library.opcheck(torch.ops.llamablock.cache_attention, (q, k, v, allowed, 0.125))  # schema, fake kernel


def test_the_static_layout_reads_the_cache_as_the_eager_engine_does(tmp_path):
    """Over a file's blocks with a float16 cache, the static layout (what the compiled engine compiles, run
    eagerly here) reads the cache through the operators and the eager engine through ctypes: the same C,
    so the same logits, bit for bit, along a prompt and its steps."""
    from gguf_tiny import write_tiny_gguf
    from hf_reference import tiny_hf_model

    from llamablock.fast.compiled.static_engine import StaticEngine
    from llamablock.fast.plan import load_gguf_native

    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16),
                    qtype="Q4_1")
    model = load_gguf_native(f, engine="compiled")[0].eval()
    ids = torch.randint(0, model.cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(5))
    eager = EagerEngine(model, kv_dtype=torch.float16)
    assert cache_attention.attach(model)
    static = StaticEngine(model, "blocks", kv_dtype=torch.float16)
    assert static.in_place
    with torch.no_grad():
        assert torch.equal(logits_along(static, ids, 20), logits_along(eager, ids, 20))


def test_heads_the_c_does_not_take_keep_the_static_layout_s_own_reading(tmp_path):
    """Heads of 8 features (not a multiple of 16): the static layout reads its cache by products and sums,
    and its steps run (the operator would refuse them); the eager reader does not cover them either."""
    from gguf_tiny import write_tiny_gguf
    from hf_reference import tiny_hf_model

    from llamablock.fast.compiled.static_engine import StaticEngine
    from llamablock.fast.plan import load_gguf_native

    f = tmp_path / "hd8.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=8),
                    qtype="Q4_1")
    model = load_gguf_native(f, engine="compiled")[0].eval()
    assert not cache_attention.takes(8, 2) and cache_attention.takes(16, 2)
    static = StaticEngine(model, "blocks", kv_dtype=torch.float16)
    assert not static.in_place
    ids = torch.randint(0, model.cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.isfinite(logits_along(static, ids, 6)).all()
