"""The 16-bit KV cache (fast/plan.py kv_dtype) on the eager engine: its logits against the float32
cache within the bound tests/kv16_bound.py states, the calculator's bytes against the tensors
allocated, and the flag."""

from __future__ import annotations

import pytest
import torch
from hf_reference import tiny_hf_model
from kv16_bound import assert_rounded_once, assert_within_bound, logits_along

import llamablock
from llamablock import cli
from llamablock.config import ModelConfig
from llamablock.diagnostics.kv_calculator import kv_cache_size
from llamablock.fast.compiled.static_decode import StaticDecoder
from llamablock.model import Decoder
from llamablock.runtime.engine import EagerEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _model(tmp_path, **kw):
    tiny_hf_model("llama", n_heads=4, n_kv=2, **kw).save_pretrained(tmp_path)
    return llamablock.load_pretrained(tmp_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("kv16"))


@pytest.mark.parametrize("kv", [torch.bfloat16, torch.float16])
def test_a_16_bit_cache_keeps_the_logits_within_its_bound(tiny, kv):
    ids = torch.randint(0, tiny.cfg.vocab_size, (1, 96), generator=torch.Generator().manual_seed(0))
    reference, engine = EagerEngine(tiny), EagerEngine(tiny, kv_dtype=kv)
    want, got = logits_along(reference, ids, 48), logits_along(engine, ids, 48)
    assert {t.dtype for t in engine.cache.keys + engine.cache.values} == {kv}
    assert_within_bound(got, want, kv)
    assert_rounded_once([engine.cache.keys[0], engine.cache.values[0]],
                        [reference.cache.keys[0], reference.cache.values[0]], kv)


@pytest.mark.parametrize("kv", [torch.bfloat16, torch.float16])
def test_a_16_bit_ring_of_a_sliding_window_keeps_the_bound(kv):
    """A window shorter than the cache keeps a ring per layer (KVCache._ring_update), which stores the new
    keys with index_copy_: in a 16-bit cache they are rounded first (a float32 key raised there)."""
    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=128,
                      sliding_window=24)
    torch.manual_seed(0)
    model = Decoder(cfg).eval()
    ids = torch.randint(0, model.cfg.vocab_size, (1, 96), generator=torch.Generator().manual_seed(0))
    reference, engine = EagerEngine(model), EagerEngine(model, kv_dtype=kv)
    want, got = logits_along(reference, ids, 48), logits_along(engine, ids, 48)
    assert engine.cache.ring == 24 and {t.dtype for t in engine.cache.keys} == {kv}
    assert_within_bound(got, want, kv)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("window", [None, 24])
def test_the_calculator_counts_the_bytes_the_eager_cache_allocates(tmp_path, dtype, window):
    """Each dtype, with and without a sliding window (a ring of W slots per layer)."""
    model = _model(tmp_path, **({} if window is None else {"sliding_window": window, "use_sliding_window": True}))
    engine = EagerEngine(model, kv_dtype=DTYPES[dtype])
    engine.prepare(100)
    allocated = sum(t.nbytes for t in engine.cache.keys + engine.cache.values)
    assert allocated == kv_cache_size(model.cfg, 100, 1, dtype).total_bytes


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_the_calculator_counts_the_bytes_the_static_cache_allocates(tiny, dtype):
    static = StaticDecoder(tiny, 256, batch=2, kv_dtype=DTYPES[dtype])
    allocated = sum(t.nbytes for t in static.cache.tensors())
    assert allocated == kv_cache_size(tiny.cfg, 256, 2, dtype).total_bytes


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from gguf_tiny import write_tiny_gguf

    f = tmp_path_factory.mktemp("kvflag") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16,
                                     max_position_embeddings=64), qtype="Q8_0")
    return str(f)


@pytest.mark.parametrize("value", ["f8", "bf16", "", "FLOAT32"])
def test_a_bad_kv_dtype_is_one_line_and_exit_2(capsys, tiny_gguf, value):
    assert cli.main(["generate", "--model", tiny_gguf, "--prompt", "abc", "--kv-dtype", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kv-dtype must be one of auto, float32, bfloat16, float16" in err, err


def test_verbose_says_the_kv_dtype(capsys, tiny_gguf):
    args = ["generate", "--model", tiny_gguf, "--prompt", "abc", "--max-new-tokens", "2", "--engine", "eager",
            "--verbose", "--kv-dtype"]
    assert cli.main([*args, "float16"]) == 0
    assert "KV cache float16" in capsys.readouterr().err
    assert cli.main([*args, "float32"]) == 0
    assert "KV cache float32" in capsys.readouterr().err


def test_the_calculator_command_says_the_dtype_it_counts(capsys):
    from llamablock.commands.kv_cache import auto_dtype

    assert cli.main(["kv-cache", "--config", "llama-3-8b", "--tokens", "8192"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert f"{auto_dtype()} (auto: a quantized model's cache on this CPU" in header
    assert cli.main(["kv-cache", "--config", "llama-3-8b", "--tokens", "8192", "--dtype", "float32"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("x batch 1, float32")


def test_the_server_s_eager_rows_keep_the_plan_s_cache_dtype(tmp_path):
    """`serve` on a quantized file: its batch engine's cache is the plan's dtype, as generate's."""
    from gguf_tiny import write_tiny_gguf

    from llamablock.fast.plan import decide
    from llamablock.io.source import open_source
    from llamablock.web.generation import load_served

    f = tmp_path / "q8.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16),
                    qtype="Q8_0")
    served = load_served(str(f), engine="eager", parallel=2)
    try:
        assert served.worker.engine.kv_dtype == getattr(torch, decide(open_source(f), "auto", "eager").kv)
    finally:
        served.worker.close()
