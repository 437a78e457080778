"""The eager engine's decode step in one C call (c/decode_step.c through fast/decode_step.py).

Reference: the eager engine itself (the Decoder's torch layers, the same block kernel for each
matrix; the Decoder is checked against transformers elsewhere), on files of each mix llama-quantize
writes (benchmarks/scaled_gguf.py MIXES: Q4_0 with a Q6_K output, Q4_K_M's Q4_K and Q6_K, Q8_0),
along a prompt and the steps after it, for every build this CPU runs and every KV cache dtype.

The bound: both compute the same float32 maths with the sums in other orders, so each value differs
by a few float32 units; what makes the difference larger is a rounding that such a difference can
flip: a 16-bit cache rounds each key and value (unit u = 2^-11 float16, 2^-8 bfloat16), and the
block kernel rounds each activation to 16 bits (a step of 2^-15 of its block's largest value). A
flipped rounding moves one value by one such step; grown through the layers and the residual stream
as tests/kv16_bound.py argues for the cache's own rounding, the logits then differ by at most
4 max(u, 2^-15) of their scale. Measured far below it (-s prints it). A step that rotates q and k in
the other pair layout (tried by hand) fails it for every mix at the float32 and float16 bounds, the
Q4_0 file's narrowly at float16's (its random weights make the rotation matter less), and
bfloat16's looser bound lets that one through. What the cache holds is checked exactly instead: the
keys and values a step writes to a 16-bit cache are those it computes for a float32 cache, rounded
once to nearest even as torch's .to() rounds them (layer 0's, whose input is the embedding alone).
"""

from __future__ import annotations

import pytest
import torch
from kernel_builds import RUNS
from kv16_bound import UNIT, assert_rounded_once, logits_along

from benchmarks.scaled_gguf import MIXES, write_scaled
from llamablock.config import ModelConfig
from llamablock.fast import decode_step
from llamablock.fast.decode_step import DecodeStep, DecodeStepEngine
from llamablock.fast.machine import this_machine
from llamablock.fast.plan import load_gguf_native
from llamablock.io.resolve import resolve_model
from llamablock.runtime.engine import EagerEngine

ACTIVATION_STEP = 2.0**-15  # the block kernel's 16-bit activations: a step of 2^-15 of the block's largest value
KV = [torch.float16, torch.bfloat16, torch.float32]

pytestmark = pytest.mark.skipif(not this_machine().kernel, reason="the block kernel does not build here")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small file of each mix: width 256, 2 layers, 4 heads over 2 key-value heads of 64, ffn 512."""
    where = tmp_path_factory.mktemp("mixes")
    return {mix: write_scaled(resolve_model(None), where / f"{mix}.gguf", 256, 2, 4, 2, 512, mix=mix) for mix in MIXES}


def _bound(kv: torch.dtype) -> float:
    return 4 * max(UNIT.get(kv, 0.0), ACTIVATION_STEP)


def _ids(model, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("isa", RUNS)
@pytest.mark.parametrize("kv", KV, ids=str)
@pytest.mark.parametrize("mix", MIXES)
def test_every_build_steps_as_the_eager_engine_within_the_bound(mix, kv, isa, files, libs):
    model = load_gguf_native(files[mix])[0]
    ids = _ids(model, 60)
    with torch.no_grad():
        want = logits_along(EagerEngine(model, kv_dtype=kv), ids, 12)
        got = logits_along(DecodeStepEngine(model, kv_dtype=kv, lib=libs[isa]), ids, 12)
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    print(f"{mix} {kv} {isa}: max |difference| {err:.3g} = {err / scale:.2e} of the logits' scale")
    assert torch.equal(got[0], want[0])  # the prefill is the eager model's own
    assert err <= _bound(kv) * scale, (err / scale, _bound(kv))


@pytest.mark.parametrize("isa", RUNS)
@pytest.mark.parametrize("kv", [torch.float16, torch.bfloat16], ids=str)
def test_every_build_writes_the_cache_rounded_once_as_torch_rounds(kv, isa, files, libs):
    """Layer 0's keys and values depend on the token alone: a step writing a 16-bit cache (F16C in the
    vector builds, the portable build's own rounding) stores what it computes for a float32 cache,
    rounded to `kv` by torch, bit for bit (the prompt's slots are the eager prefill's, the same rule)."""
    model = load_gguf_native(files["Q8_0"])[0]
    ids = _ids(model, 40, seed=3)
    caches = []
    with torch.no_grad():
        for dtype in (kv, torch.float32):
            engine = DecodeStepEngine(model, kv_dtype=dtype, lib=libs[isa])
            logits_along(engine, ids, 4)
            caches.append(engine.cache.keys + engine.cache.values)
    assert_rounded_once(caches[0][::2], caches[1][::2], kv)  # layer 0's keys, then layer 0's values


@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_biases_and_gemma_s_norms_embedding_scale_and_geglu(family, tmp_path):
    """Qwen2's q/k/v biases (added after each product), Gemma's (1 + w) norms, scaled embedding and GeGLU:
    the C step's logits stay within the float32 cache's bound of the eager engine's."""
    from gguf_families_tiny import write_family_gguf
    from gguf_tiny import write_tiny_gguf
    from hf_reference import tiny_hf_model

    f = tmp_path / f"{family}.gguf"
    if family == "qwen2":
        write_tiny_gguf(f, tiny_hf_model("qwen2", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128,
                                         head_dim=16), arch="qwen2", qtype="Q8_0")
    else:
        write_family_gguf(f, tiny_hf_model("gemma", n_heads=4, n_kv=1, tied=True, hidden_size=64,
                                           intermediate_size=128, head_dim=16), "gemma", qtype="Q8_0")
    model = load_gguf_native(f)[0]
    cfg, layer = model.cfg, model.layers[0]
    assert (layer.attn.wq.bias is not None) if family == "qwen2" else (cfg.norm_offset and cfg.embed_scale
                                                                        and layer.ffn.act == "geglu")
    ids = _ids(model, 50, seed=4)
    with torch.no_grad():
        want = logits_along(EagerEngine(model, kv_dtype=torch.float32), ids, 10)
        got = logits_along(DecodeStepEngine(model, kv_dtype=torch.float32), ids, 10)
    assert (got - want).abs().max().item() <= _bound(torch.float32) * want.abs().max().item()


def test_the_interleaved_pair_layout_and_a_cache_that_grows(files):
    """Meta's pair layout (the file's own q/k rows), past EagerEngine.FIRST slots: the cache grows to new
    buffers mid-generation, and the step follows them."""
    model = load_gguf_native(files["Q4_0"], rope_layout="interleaved")[0]
    ids = _ids(model, EagerEngine.FIRST + 40, seed=1)
    engine = DecodeStepEngine(model, kv_dtype=torch.float16)
    with torch.no_grad():
        want = logits_along(EagerEngine(model, kv_dtype=torch.float16), ids, 8)
        got = logits_along(engine, ids, 8)
    assert engine.cache.max_len > EagerEngine.FIRST
    assert (got - want).abs().max().item() <= _bound(torch.float16) * want.abs().max().item()


def test_the_same_bits_whatever_the_threads(files):
    """Threads split each matrix's rows and the attention's tiles, never a sum: one thread and two agree."""
    model = load_gguf_native(files["Q4_K_M"])[0]
    ids = _ids(model, 30, seed=2)
    runs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.no_grad():
                runs.append(logits_along(DecodeStepEngine(model, kv_dtype=torch.float16), ids, 6))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(*runs)


@pytest.mark.parametrize("isa", RUNS)
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "rows"])
@pytest.mark.parametrize("mix", MIXES)
def test_the_step_s_embedding_is_the_model_s_bit_for_bit(mix, grouped, isa, files, libs):
    """The step reads each id's table row by one C call (DecodeStep.embed): the same float32 values as
    the model's BlockEmbedding, for ids at every place in a group of 8 rows and both ends of the table,
    in either layout (the loader groups these tables; an ungroupable type, Q5_0, stays in rows); an id
    out of range gets the model's own error."""
    from llamablock.fast.kernels.file_blocks import BlockEmbedding, BlockLinear

    model = load_gguf_native(files[mix])[0]
    table = model.embed.head[0]
    assert table.grouped
    if not grouped:  # the same bytes in the file's order (untied: the head keeps its grouped copy)
        model.embed = BlockEmbedding(BlockLinear(table.type_name, table.file_rows(), table.in_features), owned=True)
    step = DecodeStep(model, lib=libs[isa])
    assert step.table is model.embed.head[0] and step.table.grouped == grouped
    v = model.cfg.vocab_size
    ids = torch.tensor([[0], [1], [7], [8], [13], [v - 9], [v - 2], [v - 1]])
    lengths = torch.arange(ids.shape[0])
    with torch.no_grad():
        want = model.embed_tokens(ids, lengths[:, None]).reshape(ids.shape[0], -1)
        got = step.embed(ids, lengths)
    assert got.is_contiguous() and torch.equal(got, want)
    with pytest.raises(ValueError, match=f"token id {v} is out of range"):
        step.embed(torch.tensor([[v]]), torch.tensor([0]))


@pytest.mark.parametrize("change, reason", [
    (dict(sliding_window=64), "a sliding window"),
    (dict(norm="layernorm"), "a norm other than RMSNorm"),
    (dict(ffn="gelu"), "feed-forward 'gelu'"),
    (dict(n_heads=16, n_kv_heads=2), "heads of 8 features"),
    (dict(qk_norm=True), "q/k norms"),
])
def test_what_it_does_not_take_is_named(change, reason):
    cfg = ModelConfig(**{**dict(vocab_size=256, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2), **change})
    assert reason in (decode_step.config_reason(cfg) or "")


def test_a_model_not_over_blocks_is_refused_with_the_reason(files):
    from llamablock.fast.kernels.quant import apply_dtype
    from llamablock.io.loading import load_decoder
    from llamablock.io.source import open_source

    q8 = apply_dtype(load_decoder(open_source(files["Q8_0"], tokenizer=False), torch.bfloat16), "q8", {})
    with pytest.raises(ValueError, match="does not take layer matrices other than the file's blocks"):
        DecodeStep(q8)
    with pytest.raises(ValueError, match="a torch.float64 KV cache"):
        DecodeStep(load_gguf_native(files["Q8_0"])[0], torch.float64)


def test_the_plan_s_engine_steps_in_c_and_says_so(files):
    from llamablock.fast.plan import build, decide
    from llamablock.io.source import open_source

    source = open_source(files["Q4_K_M"], tokenizer=False)
    plan = decide(source)
    assert plan.c_step and "its decode steps in C" in plan.describe()
    engine = build(source, plan).engine
    assert isinstance(engine, DecodeStepEngine) and engine.describe().endswith("decode steps in C")


def test_a_position_past_the_bound_cache_is_refused(files):
    from llamablock.kv_cache import KVCache

    model = load_gguf_native(files["Q4_0"])[0]
    step = DecodeStep(model)
    step.bind(KVCache(model.cfg, 1, 16, dtype=torch.float16))
    x = torch.zeros(model.cfg.d_model)
    with pytest.raises(ValueError, match="position 16 is outside the bound KV cache's 16 slots"):
        step(x, 16)
    with pytest.raises(ValueError, match=r"2 rows of lengths \[3, 3\] do not fit the bound cache \(1 rows"):
        step(torch.zeros(2, model.cfg.d_model), 3)  # one sequence's cache: no second row to write
    with pytest.raises(ValueError, match=r"lengths \[5\] do not fit .* frontier 3"):
        step(x, 3, torch.tensor([5]))  # more tokens before the frontier than it has slots
    assert torch.isfinite(step(x, 0)).all()
