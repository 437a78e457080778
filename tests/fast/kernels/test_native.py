"""`--dtype auto` where the blocks are re-quantized: each GGUF weight in the packed format its type
maps to, loaded tensor by tensor. That is every K-quant and Q5 tensor, and Q4_0 / Q4_1 / Q8_0 where
the block kernel cannot be built (fast/kernels/ggml_kernel.py; `_packed_path` turns it off here: the
kept blocks are tests/fast/kernels/test_file_blocks.py's).

References: the dequantize-then-quantize path (`load_dtype` + `apply_dtype`, itself checked
against float32 in tests/fast/kernels/test_quant.py): loading straight into the packed layers must give
the same logits bit for bit, since both quantize the same bfloat16-rounded weights. A tied
embedding stored quantized is the one exception by design: the straight load keeps one int8 copy,
the head's, and the embedding reads its rows (Int8Embedding), so it equals the old path with that
embedding, and each embedding value lies within the q8 format's error of the file's. Memory is
measured in child processes (peak resident set growth over an interpreter with torch loaded).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from gguf_tiny import random_kquant_blocks, write_tiny_gguf
from hf_reference import tiny_hf_model
from peak_memory import peak_memory
from torch import nn

import llamablock
from llamablock.fast.formats import dir_format
from llamablock.fast.kernels.quant import Int4Linear, Int8Embedding, Int8Linear, apply_dtype
from llamablock.fast.plan import load_gguf_native, load_in_format, own_format
from llamablock.io.resolve import resolve_model
from llamablock.io.source import open_source


@pytest.fixture(autouse=True)
def _packed_path(monkeypatch):
    from llamablock.fast import machine
    from llamablock.fast.kernels.quant import PREFILL_ROWS

    no_kernel = machine.this_machine().without_kernel("turned off by the test")  # the GEMM from PREFILL_ROWS on every CPU:
    no_kernel = dataclasses.replace(no_kernel, prefill={"q8": PREFILL_ROWS, "q4": PREFILL_ROWS})  # as apply_dtype's
    monkeypatch.setattr(machine, "this_machine", lambda: no_kernel)


def _tiny(tmp_path, qtype, tied=False, **kw):
    f = tmp_path / f"{qtype}{'-tied' if tied else ''}.gguf"
    # widths in whole blocks of 32, as quantized GGUF files have them
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16,
                                     tied=tied), qtype=qtype, **kw)
    return f


def _old_path(f, fmt):
    """The dequantize-then-quantize model; a tied one's embedding then reads the q8 head's rows,
    as the straight load's does."""
    old = apply_dtype(llamablock.load_pretrained(f, torch.bfloat16), fmt)
    if old.cfg.tie_embeddings:
        old.embed = Int8Embedding(old.head)
    return old


BF16_U = 2.0**-8  # unit roundoff of bfloat16


def _kinds(model) -> dict[str, str]:
    return {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, (nn.Linear, Int8Linear, Int4Linear))}


@pytest.mark.parametrize("qtype,want,dtype", [("F32", "Linear", torch.float32), ("F16", "Linear", torch.bfloat16),
                                              ("Q8_0", "Int8Linear", torch.bfloat16), ("Q4_1", "Int4Linear", torch.bfloat16),
                                              ("Q5_0", "Int8Linear", torch.bfloat16)])
def test_each_gguf_type_picks_its_format(tmp_path, qtype, want, dtype):
    model, used = load_gguf_native(_tiny(tmp_path, qtype))
    kinds = _kinds(model)
    assert model.embed.weight.dtype == dtype and model.layers[0].norm1.weight.dtype == dtype
    assert kinds["layers.0.attn.wq"] == want and kinds["layers.0.ffn.w_down"] == want
    assert kinds["head"] == ("Linear" if want == "Linear" else "Int8Linear")  # the head stays 8-bit
    if want == "Linear":
        assert model.layers[0].attn.wq.weight.dtype == dtype
    assert used.get("q4", 0) + used.get("q8", 0) == (0 if want == "Linear" else 2 * 7 + 1)  # 7 per layer + head


def test_a_mixed_file_keeps_each_tensors_format(tmp_path):
    """A Q4_K_M-like file: most weights 4-bit, one tensor 6-bit (Q6_K, kept at 8 bits)."""
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=256, intermediate_size=256, head_dim=64)
    raw = {"blk.0.ffn_down.weight": (random_kquant_blocks("Q6_K", 256, 256), "Q6_K")}
    f = tmp_path / "mixed.gguf"
    write_tiny_gguf(f, hf, qtype="Q4_0", raw_blocks=raw)
    kinds = _kinds(load_gguf_native(f)[0])
    assert kinds["layers.0.ffn.w_down"] == "Int8Linear" and kinds["layers.1.ffn.w_down"] == "Int4Linear"
    assert own_format(open_source(f)) == "q4"  # the compiled engine runs the majority format


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("qtype,fmt", [("Q8_0", "q8"), ("Q4_1", "q4")])
def test_straight_load_equals_dequantize_then_quantize(tmp_path, qtype, fmt, tied, monkeypatch):

    # 40 rows: the GEMM on every CPU (the fixture's machine)
    f = _tiny(tmp_path, qtype, tied)
    native, _ = load_gguf_native(f)
    assert isinstance(native.embed, Int8Embedding) == tied
    old = _old_path(f, fmt)
    with torch.no_grad():
        for t in (5, 40):  # the packed kernels, then the prefill GEMM (PREFILL_ROWS)
            ids = torch.randint(0, 97, (1, t))
            assert torch.equal(native(ids), old(ids))


def _embedding_error_bound(table: torch.Tensor, head: Int8Linear) -> torch.Tensor:
    """Per value of the shared table, against the float table the head was quantized from: half
    the row's step, the bfloat16 rounding of the step (a row maximum may clamp at 127 by as much),
    and the bfloat16 rounding of the row read (tests/fast/kernels/test_quant.py derives the first two)."""
    return head.scales.float()[:, None] / 2 + 2 * BF16_U * table.abs().amax(1, keepdim=True)


def test_a_tied_quantized_embedding_is_the_heads_int8_rows(tmp_path):
    f = _tiny(tmp_path, "Q4_1", tied=True)
    native, used = load_gguf_native(f)
    assert native.embed.qweight is native.head.qweight and native.embed.weight.dtype == torch.bfloat16
    assert used["q8"] == 1  # the file's one embedding tensor, serving the head too
    table = llamablock.load_pretrained(f, torch.bfloat16).embed.weight.float()  # (vocab, d), the file's
    got = native.embed(torch.arange(table.shape[0])).float()
    assert ((got - table).abs() <= _embedding_error_bound(table, native.head)).all()


@pytest.mark.slow
def test_smollm2_straight_load_equals_the_old_path_and_runs_in_q4(monkeypatch):

    # the long text: the GEMM (the fixture's machine)
    source = open_source(None)
    (native, what), tok = load_in_format(source, "auto"), source.tokenizer
    assert "210 tensors q4" in what and own_format(source) == "q4"
    assert isinstance(native.embed, Int8Embedding)
    table = llamablock.load_pretrained(None, torch.bfloat16).embed.weight.float()
    old = _old_path(None, "q4")
    long = " ".join(["The capital of France is Paris, and the capital of Spain is Madrid."] * 3)
    with torch.no_grad():
        for text in ("The capital of France is", long):  # 6 tokens (kernels) and more than PREFILL_ROWS
            ids = torch.tensor([tok.encode(text)])
            assert torch.equal(native(ids), old(ids))
    rows = torch.arange(0, table.shape[0], 7)
    got = native.embed(rows).float()
    assert ((got - table[rows]).abs() <= _embedding_error_bound(table, native.head)[rows]).all()


def test_a_directory_runs_in_its_torch_dtype(tmp_path):
    from hf_reference import tiny_hf_model

    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path)
    conf = tmp_path / "config.json"
    for stored, want in (("bfloat16", "bfloat16"), ("float16", "bfloat16"), ("float32", "float32"), (None, "float32")):
        d = {k: v for k, v in json.loads(conf.read_text()).items() if k not in ("torch_dtype", "dtype")}
        conf.write_text(json.dumps({**d, "torch_dtype": stored}))
        source = open_source(tmp_path, tokenizer=False)
        assert own_format(source) == want and dir_format(stored or "float32", "config.json") == want
        model, what = load_in_format(source, "auto")
        assert what == want and model.embed.weight.dtype == getattr(torch, want)


# Times the file's size, for the load and for the whole run; see the test's docstring.
LOAD_BOUND, RUN_BOUND = 2.0, 2.3


@pytest.mark.slow
def test_peak_memory_of_the_straight_load_against_the_file_size():
    """SmolLM2's Q4_1 file run as `generate --dtype auto` runs it (load_model, then 32 tokens of
    eager decode on one thread), in a child process, as `llamablock bench memory` measures it: the
    peak resident growth over the interpreter with torch loaded stays under LOAD_BOUND times the
    file's size at the end of the load and under RUN_BOUND after the decode. The bounds leave
    room for the run-to-run spread of the heap's holes and of a fresh machine.

    The child runs the default path: the file's own blocks where the block kernel builds (its
    weights then take the file's bytes, fast/kernels/file_blocks.py), the packed layers where it does not.
    Beyond the weights the load's peak holds the tokenizer and the library code the load pages in;
    the decode adds the cache and the scratch of its kernels (the growth over a long generation is
    bounded in tests/runtime/test_generate.py). What the load no longer holds: the reader's parse
    of the vocabulary and the file's mapped pages (io/gguf.py, io/gguf_read.py), a nibble copy of
    every q4 layer (fast/kernels/int4pack.py), a float embedding beside the 8-bit head (Int8Embedding,
    BlockEmbedding), the heap's holes between weights (fast/kernels/malloc.py)."""
    path = str(resolve_model(None))
    load, run = peak_memory(path)
    size = os.path.getsize(path)
    print(f"peak / file size: load {load / size:.2f}, run {run / size:.2f}")
    assert 0 < load < LOAD_BOUND * size, load / size
    assert load <= run < RUN_BOUND * size, run / size


def test_the_straight_load_holds_one_tensor_in_float_at_a_time(tmp_path, monkeypatch):
    """The property the memory rests on: while a weight is dequantized, no earlier one is still
    held in float (each is packed, and its float copy dropped, before the next is read)."""
    import weakref

    import llamablock.fast.kernels.native as native

    alive, worst = [], [0]
    original = native.gguf_tensors

    def watched(*args, **kw):
        for name, kind, w in original(*args, **kw):
            alive[:] = [r for r in alive if r() is not None]
            worst[0] = max(worst[0], len(alive))
            if ".attn." in name or ".ffn." in name:  # packed: their float copies must not pile up
                alive.append(weakref.ref(w))
            yield name, kind, w
            del w

    monkeypatch.setattr(native, "gguf_tensors", watched)
    load_gguf_native(_tiny(tmp_path, "Q4_1"))
    assert worst[0] == 0, worst[0]  # no earlier packed weight still held when the next is read


def test_bad_dtype_is_refused():
    with pytest.raises(ValueError, match="--dtype must be one of auto"):
        load_in_format(open_source(None, tokenizer=False), "int3")


def test_generate_says_which_formats_it_runs(capsys, tmp_path):
    from llamablock import cli

    f = _tiny(tmp_path, "Q8_0")
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc", "--max-new-tokens", "3"]) == 0
    assert "weights: the file's own precision: " in capsys.readouterr().err

