"""The static layout and its compiled decode step against the eager Decoder.

References: the eager `Decoder` with its KVCache (itself checked against transformers in
test_hf_parity.py). Tolerances: the static layout runs the same float32 operations on the same
numbers but fuses matmuls (different blocking of the sums) and softmaxes over the filled cache slots
(none past the position), so logits agree to 1e-5 absolute on logits of size ~1; the
compiled step (inductor's own kernels) to 1e-4. Greedy tokens must be equal.
Compilation of a 2-layer model takes a few seconds (autotune off; the speed path's autotuning
is the same graph with other GEMM kernels).
"""

import os
from pathlib import Path

import pytest
import torch
from hf_reference import tiny_hf_model

import llamablock
from llamablock.config import ModelConfig
from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.compiled.inductor_engine import InductorEngine
from llamablock.fast.compiled.static_decode import (
    MIN_CACHE,
    StaticDecoder,
    cache_length,
    unsupported_reason,
)
from llamablock.fast.compiled.static_engine import PREFILL_MIN, StaticEngine
from llamablock.kv_cache import KVCache
from llamablock.model import Decoder
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate
from llamablock.runtime.sampling import Sampling

PROMPT = [5, 17, 3, 88, 42, 9, 61]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # each test compiles its own graphs; no recompile limit carried over


def _eager_logits(model, ids, steps):
    """Logits of the prefill and of each greedy step, eager Decoder with KVCache."""
    cache = KVCache(model.cfg, 1, ids.shape[1] + steps + 1, dtype=model.embed.weight.dtype)
    out = [model(ids, cache=cache, last_only=True)[:, -1]]
    for _ in range(steps):
        out.append(model(out[-1].argmax(-1, keepdim=True), cache=cache)[:, -1])
    return out


def _assert_static_equals_eager(model, ids, steps, length):
    """The static layout, run eagerly, against the eager Decoder: prefill and each greedy step."""
    static = StaticDecoder(model, length)
    ref = _eager_logits(model, ids, steps)
    got = _static_logits(static.prefill, lambda t, p: static.step(t, torch.tensor([p])), ids, steps)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)


def _static_logits(prefill, step, ids, steps):
    out = [prefill(ids)]
    for i in range(steps):
        out.append(step(out[-1].argmax(-1, keepdim=True), ids.shape[1] + i))
    return out


@torch.no_grad()
@pytest.mark.parametrize("family,kw", [("llama", {"n_heads": 4, "n_kv": 2}), ("qwen2", {"n_heads": 4, "n_kv": 1}),
                                       ("gemma", {"n_heads": 4, "n_kv": 1}), ("mistral", {"n_heads": 4, "n_kv": 2})])
def test_padded_prefill_equals_eager_decoder(tmp_path, family, kw):
    """150 tokens padded at their end with 42 junk tokens (as the compiled prefill pads short
    prompts), logits taken at the last real one: those logits, the cache of the real slots and the
    greedy steps after it equal the eager Decoder's (1e-5, float32). The tiny Mistral's window of
    8 tokens runs the windowed mask."""
    tiny_hf_model(family, **kw).save_pretrained(tmp_path)
    model = llamablock.load_pretrained(tmp_path)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 150), generator=gen)
    padded = torch.cat([ids, torch.randint(0, model.cfg.vocab_size, (1, 42), generator=gen)], dim=1)
    static, plain = StaticDecoder(model, 256), StaticDecoder(model, 256)
    ref = _eager_logits(model, ids, 6)
    got = _static_logits(lambda x: static.prefill(padded, torch.tensor([149])),
                         lambda t, p: static.step(t, torch.tensor([p])), ids, 6)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=0)
    plain.prefill(ids)
    for a, b in zip(static.cache.keys, plain.cache.keys, strict=True):
        torch.testing.assert_close(a[:, :, :150], b[:, :, :150], atol=1e-5, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("family,kw", [("llama", {"n_heads": 4, "n_kv": 2}), ("llama", {"n_heads": 4, "n_kv": 1}),
                                       ("qwen2", {"n_heads": 4, "n_kv": 2}), ("gemma", {"n_heads": 4, "n_kv": 1})])
def test_static_layout_equals_eager_decoder(tmp_path, family, kw):
    tiny_hf_model(family, **kw).save_pretrained(tmp_path)
    _assert_static_equals_eager(llamablock.load_pretrained(tmp_path), torch.tensor([PROMPT]), 10, 64)


@torch.no_grad()
def test_sliding_window_is_applied_in_the_static_step():
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64, sliding_window=5)
    model = Decoder(cfg).eval()
    ids = torch.randint(0, 64, (1, 9))  # longer than the window: the prefill and every step use it
    _assert_static_equals_eager(model, ids, 6, 32)


@torch.no_grad()
def test_compiled_step_equals_eager(tiny):
    ids = torch.tensor([PROMPT])
    ref = _eager_logits(tiny, ids, 12)
    engine = InductorEngine(tiny, autotune=False)
    got = _static_logits(engine.prefill, engine.step, ids, 12)
    assert engine.compile_seconds > 0  # the first step compiled
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=0)
        assert int(r.argmax()) == int(g.argmax())


def test_generate_with_the_compiled_engine_equals_eager(tiny):
    engine = InductorEngine(tiny, autotune=False)
    a = generate(EagerEngine(tiny), PROMPT, max_new_tokens=20)
    b = generate(engine, PROMPT, max_new_tokens=20)
    assert a.tokens == b.tokens and len(b.tokens) == 20
    s = Sampling(temperature=0.8, top_k=30, top_p=0.95, repetition_penalty=1.2)
    a = generate(EagerEngine(tiny), PROMPT, max_new_tokens=20, sampling=s, seed=3)
    b = generate(engine, PROMPT, max_new_tokens=20, sampling=s, seed=3)
    assert a.tokens == b.tokens
    # A second request reuses the graph; stale slots from the first are masked out.
    c = generate(engine, PROMPT[:3], max_new_tokens=20)
    assert c.tokens == generate(EagerEngine(tiny), PROMPT[:3], max_new_tokens=20).tokens


@torch.no_grad()
@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_quantized_engine_equals_quantized_eager_model(tiny, fmt):
    """q8/q4 in the engine (fused q/k/v quantized) equals the same format on the eager model:
    int8 scales are per row and int4 groups lie within a row, so quantizing a stacked matrix is
    stacking the rows' quantizations; only the matmul blocking differs."""
    import copy

    from llamablock.fast.kernels.quant import quantize_model

    bf16 = copy.deepcopy(tiny).to(torch.bfloat16)
    eager = quantize_model(copy.deepcopy(bf16), fmt)
    engine = StaticEngine(bf16, fmt)
    ids = torch.tensor([PROMPT])
    ref = _eager_logits(eager, ids, 8)
    got = _static_logits(engine.prefill, engine.step, ids, 8)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g.float(), r.float(), atol=0.05, rtol=0.02)  # bfloat16 activations


def test_cache_grows_for_longer_requests(tiny):
    engine = StaticEngine(tiny)
    engine.start(10)
    assert engine.length == MIN_CACHE
    long_prompt = (PROMPT * 40)[:MIN_CACHE]
    g = generate(engine, long_prompt, max_new_tokens=4)  # needs MIN_CACHE + 4 slots
    assert engine.length == 2 * MIN_CACHE
    assert g.tokens == generate(EagerEngine(tiny), long_prompt, max_new_tokens=4).tokens


def test_cache_length_rule():
    assert cache_length(1, 8192) == MIN_CACHE and cache_length(MIN_CACHE + 1, 8192) == 2 * MIN_CACHE
    assert cache_length(300, 400) == 400  # capped at the context
    with pytest.raises(ValueError, match="exceed the model's context"):
        cache_length(9000, 8192)


def test_unsupported_configs_are_named(tiny):
    base = dict(vocab_size=64, d_model=32, n_layers=1, n_heads=4)
    assert "alibi" in unsupported_reason(ModelConfig(**base, position="alibi"))
    assert "post-LN" in unsupported_reason(ModelConfig(**base, norm_placement="post", norm="layernorm"))
    dyn = ModelConfig(**base, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert "dynamic NTK" in unsupported_reason(dyn)
    with pytest.raises(ValueError, match="does not support position 'learned'"):
        StaticEngine(Decoder(ModelConfig(**base, position="learned")))
    with pytest.raises(ValueError, match="needs the model loaded in torch.bfloat16"):
        AOTIEngine(tiny, "q8")
    with pytest.raises(ValueError, match="format must be one of"):
        InductorEngine(tiny, "q3")
    with pytest.raises(TypeError, match="generate runs an engine"):
        generate(tiny, PROMPT, 4)


def test_persistent_compile_cache_location(monkeypatch, tmp_path):
    import torch._inductor.runtime.cache_dir_utils

    from llamablock.fast.compiled.compile_cache import use_persistent_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert use_persistent_cache() == tmp_path / "llamablock" / "inductor"
    assert torch._inductor.runtime.cache_dir_utils.cache_dir() == str(tmp_path / "llamablock" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_persistent_cache() == tmp_path / "mine"  # the user's choice wins
    from llamablock.fast.compiled.aoti_step import package_dir

    # aoti_step reads the variable without importing inductor: it must name inductor's directory
    assert package_dir() == Path(torch._inductor.runtime.cache_dir_utils.cache_dir()) / "llamablock-aoti"


_FRESH_PROCESS = r"""
import sys, torch, llamablock
from llamablock.fast.compiled.aoti_engine import AOTIEngine
model = llamablock.load_pretrained(sys.argv[1], torch.bfloat16)
engine = AOTIEngine(model, "bfloat16")  # autotuned: bfloat16 GEMM templates may use AMX
with torch.no_grad():
    logits = engine.prefill(torch.arange(1, 21)[None])
    logits = engine.step(logits.argmax(-1, keepdim=True), 20)
print(engine.compile_seconds > 0, logits.float().sum().item())
"""


@pytest.mark.slow
def test_a_fresh_process_runs_the_cached_programs(tmp_path):
    """The second process only loads the libraries the first compiled (autotuned bfloat16 step and
    prefill); it must run them and get the same logits. A library whose GEMMs use AMX killed such a
    process with SIGILL (exit -4, checked by removing the fix) until AOTIProgram asked Linux for AMX
    tiles itself. On a CPU without AMX the libraries do not use it and this checks the reload only."""
    import subprocess
    import sys

    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path / "model")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", _FRESH_PROCESS, str(tmp_path / "model")], env=env,
                           capture_output=True, text=True) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    first, second = (r.stdout.split()[-2:] for r in runs)
    assert first[0] == "True" and second[0] == "False"  # compiled, then loaded
    assert first[1] == second[1]


def test_prune_deletes_least_recently_used_packages_beyond_the_limit(tmp_path):
    from llamablock.fast.compiled.aoti_step import prune

    for i, name in enumerate(["old", "mid", "new", "kept", ".compiling.123"]):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lib.so").write_bytes(b"x" * 1000)
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    os.utime(tmp_path / "kept", (1, 1))  # the oldest, but the package just compiled
    removed = prune(tmp_path, keep=tmp_path / "kept", max_bytes=2500)
    # the oldest packages first, until 2 x 1000 bytes remain
    assert removed == [tmp_path / "old", tmp_path / "mid"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".compiling.123", "kept", "new"]
    assert prune(tmp_path, keep=tmp_path / "kept", max_bytes=10**6) == []


def test_drop_build_copy_deletes_only_the_packages_files(tmp_path):
    from llamablock.fast.compiled.aoti_step import drop_build_copy

    model = tmp_path / "llamablock-aoti" / ".key.1" / "package" / "data" / "aotinductor" / "model"
    model.mkdir(parents=True)
    for name in ("cw.wrapper.so", "cw.wrapper.cpp", "ck.kernel.cpp"):
        (model / name).write_bytes(b"x")
    build, shared = tmp_path / "cbuild", tmp_path / "cshared"
    for d in (build / "cw", shared / "cw"):
        d.mkdir(parents=True)
    for name in ("cw.wrapper.so", "cw.wrapper.cpp", "ck.kernel.cpp"):
        (build / name).write_bytes(b"x")
    (shared / "cw.wrapper.so").write_bytes(b"x")
    (shared / "cother.wrapper.so").write_bytes(b"x")  # another compile building in the same directory
    removed = drop_build_copy(model.parents[3], tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in removed) == [
        "cbuild/ck.kernel.cpp", "cbuild/cw.wrapper.cpp", "cbuild/cw.wrapper.so", "cshared/cw.wrapper.so"]
    assert not build.exists()  # emptied, so removed with the wrapper's directory
    assert sorted(p.name for p in shared.iterdir()) == ["cother.wrapper.so"]
    assert sorted(p.name for p in model.iterdir()) == ["ck.kernel.cpp", "cw.wrapper.cpp", "cw.wrapper.so"]


@torch.no_grad()
def test_aoti_backend_equals_eager_and_reloads_from_its_package(tiny):
    """The AOTInductor step and prefill give the eager logits (1e-4) and tokens, the prefill at
    lengths below its minimum (padded), inside its range and at its maximum (L - 1); a second
    engine with the same weights loads the unpacked packages instead of compiling; other weights
    get another key."""
    engine = AOTIEngine(tiny, autotune=False)
    gen = torch.Generator().manual_seed(0)
    for n, steps in ((len(PROMPT), 8), (150, 8), (255, 0)):  # 7 < PREFILL_MIN, 150, and 255 = L - 1
        ids = torch.tensor([PROMPT]) if n == len(PROMPT) else torch.randint(0, tiny.cfg.vocab_size, (1, n), generator=gen)
        ref = _eager_logits(tiny, ids, steps)
        got = _static_logits(engine.prefill, engine.step, ids, steps)
        for r, g in zip(ref, got, strict=True):
            torch.testing.assert_close(g, r, atol=1e-4, rtol=0)
    assert engine._prefill_program is not None and engine.length == 256 and PREFILL_MIN > len(PROMPT)
    for program in (engine._step_program, engine._prefill_program):
        (library,) = program.path.glob("*/data/aotinductor/model/*.so")
        # AOTInductor's build copy of the library is gone from the inductor cache (drop_build_copy)
        assert not list(program.path.parent.parent.glob(f"*/{library.name}"))
    assert engine.compile_seconds > 0
    again = AOTIEngine(tiny, autotune=False)
    assert generate(again, PROMPT, max_new_tokens=12).tokens == generate(EagerEngine(tiny), PROMPT, max_new_tokens=12).tokens
    assert again.compile_seconds == 0 and again._step_program.path == engine._step_program.path
    import copy

    other = copy.deepcopy(tiny)
    other.layers[0].ffn.w_up.weight[0, 0] += 1.0
    from llamablock.fast.compiled.aoti_step import package_key

    a, b = StaticDecoder(tiny, 64), StaticDecoder(other, 64)
    example = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    assert package_key(a, "float32", {}, "step", example) != package_key(b, "float32", {}, "step", example)


def test_package_key_names_the_source(tiny, monkeypatch, tmp_path):
    """A program is traced from llamablock's code, so its key hashes that code: an edited or
    upgraded llamablock compiles again instead of loading programs of the code before."""
    from llamablock.fast.compiled import aoti_step

    for name, text in (("a.py", "x = 1"), ("sub/b.py", "y = 2")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    before = aoti_step.source_digest(tmp_path)
    (tmp_path / "sub/b.py").write_text("y = 3")
    aoti_step.source_digest.cache_clear()
    assert aoti_step.source_digest(tmp_path) != before
    static = StaticDecoder(tiny, 64)
    example = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    key = aoti_step.package_key(static, "float32", {}, "step", example)
    monkeypatch.setattr(aoti_step, "source_digest", lambda: "edited")
    assert aoti_step.package_key(static, "float32", {}, "step", example) != key


@torch.no_grad()
def test_float32_step_calls_mkl_gemv_and_equals_eager(tiny):
    """The float32 step's default settings swap the C++ GEMM templates for aten.mm on unpacked
    weights, the other formats keep the templates as they are, and every format keeps pointwise
    results of more than 8 ops as buffers (build_options.step_options); the float32 step's logits
    equal the eager model's (1e-4)."""
    from llamablock.fast.compiled.build_options import inductor_options, step_options

    assert step_options("float32", inductor_options(True)) == {"freezing": True, "cpp.weight_prepack": False,
                                                               "realize_opcount_threshold": 8}
    assert step_options("q8", inductor_options(True)) == {**inductor_options(True), "realize_opcount_threshold": 8}
    assert step_options("float32", inductor_options(False)) == inductor_options(False)
    engine = AOTIEngine(tiny, "float32", compile_prefill=False)
    ids = torch.tensor([PROMPT])
    for r, g in zip(_eager_logits(tiny, ids, 6), _static_logits(engine.prefill, engine.step, ids, 6), strict=True):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=0)
