"""The 16-bit KV cache in the static layout and its compiled programs (the bound is stated in
tests/kv16_bound.py: 4 u of the logits' scale, u = 2^-8 for bfloat16, 2^-11 for float16),
and a cache of another dtype being another program and another build."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from kv16_bound import assert_rounded_once, assert_within_bound, logits_along

from llamablock.fast.compiled import builds
from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.compiled.aoti_step import package_key
from llamablock.fast.compiled.batch_compiled import CompiledBatchEngine
from llamablock.fast.compiled.static_decode import StaticDecoder
from llamablock.fast.compiled.static_engine import StaticEngine


@pytest.fixture(scope="module")
def ids(tiny):
    return torch.randint(0, tiny.cfg.vocab_size, (1, 96), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kv", [torch.bfloat16, torch.float16])
def test_the_static_layout_with_a_16_bit_cache_keeps_its_bound(tiny, ids, kv):
    reference, engine = StaticEngine(tiny, "float32"), StaticEngine(tiny, "float32", kv_dtype=kv)
    want, got = logits_along(reference, ids, 48), logits_along(engine, ids, 48)
    assert {t.dtype for t in engine.static.cache.tensors()} == {kv}
    assert_within_bound(got, want, kv)
    assert_rounded_once(engine.static.cache.tensors(), reference.static.cache.tensors(), kv)


def test_the_compiled_step_with_a_bfloat16_cache_keeps_its_bound(tiny, ids):
    """The AOTInductor step and prefill over a bfloat16 cache, against the float32 cache's static layout; and
    against the same cache run eagerly, to the compiled step's own tolerance (1e-4)."""
    torch._dynamo.reset()
    want = logits_along(StaticEngine(tiny, "float32"), ids, 48)
    same = logits_along(StaticEngine(tiny, "float32", kv_dtype=torch.bfloat16), ids, 48)
    engine = AOTIEngine(tiny, "float32", autotune=False, kv_dtype=torch.bfloat16)
    got = logits_along(engine, ids, 48)
    assert {engine.running.get(m) for m in ("step", "prefill")}.isdisjoint({None, "eager"}), engine.running
    assert all(t.dtype == torch.bfloat16 for t in engine._step_program.caches)
    assert_within_bound(got, want, torch.bfloat16)
    torch.testing.assert_close(got, same, atol=1e-4, rtol=0)
    float32 = StaticEngine(tiny, "float32")
    logits_along(float32, ids, 48)
    assert_rounded_once(engine.static.cache.tensors(), float32.static.cache.tensors(), torch.bfloat16)


def test_a_program_over_another_cache_dtype_is_another_package(tiny):
    example = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    keys = {kv: package_key(StaticDecoder(tiny, 256, kv_dtype=kv), "float32", {}, "step", example, "w")
            for kv in (torch.float32, torch.bfloat16, torch.float16)}
    assert len(set(keys.values())) == 3
    # a program that reads its cache by the kernel's operators (over blocks: StaticEngine.in_place) is another too
    in_place = package_key(StaticDecoder(tiny, 256, kv_dtype=torch.float16, in_place=True), "float32", {}, "step",
                           example, "w")
    assert in_place != keys[torch.float16]


def test_a_build_is_recorded_under_its_kv_dtype(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"x")
    package = tmp_path / "package"
    package.mkdir()
    for kv, name in ((torch.bfloat16, "float32 kv bfloat16"), (torch.float32, "float32")):
        engine = SimpleNamespace(fmt="float32", kv_dtype=kv, model=tiny, length=256, packages=lambda: [package],
                                 autotune=False, batch=1)
        builds.record_engine(model_file, engine, 1.0)
        assert builds.built_length(model_file, name) == 256
    assert builds.built_length(model_file, "float32 kv float16") is None


def test_the_compiled_rows_eager_partner_keeps_the_same_cache_dtype(tiny):
    compiled = StaticEngine(tiny, "float32", batch=2, kv_dtype=torch.float16)
    compiled.prepare(64)
    engine = CompiledBatchEngine(tiny, compiled)
    assert engine.eager.kv_dtype == torch.float16
    rows = [engine.add([1, 2, 3], 4), engine.add([4, 5, 6, 7], 4)]
    engine.prefill_next(rows)
    assert {t.dtype for t in compiled.static.cache.tensors()} == {torch.float16}
    engine.step(torch.tensor([8, 9]))
