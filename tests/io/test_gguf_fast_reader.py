"""io/gguf_fast_reader.py: every field and tensor it reads, against the `gguf` package's own reader.

Reference: `gguf.GGUFReader`, unchanged, on the same files: the embedded SmolLM2-135M (its
tokenizer's arrays are what the fast path parses), the tiny files the loader tests write
(gguf_tiny, gguf_families_tiny: each architecture, float, Q8_0 and raw K-quant tensors, RoPE
tensors), a file of every kind of array, and one of empty arrays (written by hand: the package's
writer refuses them). Equal means: the same keys in the same order, each with the same offset,
types and contents (values and their Python types); the same tensors, each with the same name,
type, shape, element and byte counts and offset; the reader's data offset, alignment and byte
order; and the bytes of the first, middle and last tensors. The fast class is compared directly,
whatever gguf is installed, so a new version can be checked before it is listed. A file cut inside
an array must be refused, not read short; an unlisted gguf version opens files with the package's
reader.
"""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from gguf_families_tiny import write_family_gguf
from gguf_tiny import random_kquant_blocks, write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock.io import gguf_fast_reader
from llamablock.io.gguf import open_gguf
from llamablock.io.gguf_fast_reader import CHECKED_GGUF_VERSIONS, fast_reader_class, reader_choice
from llamablock.io.resolve import resolve_model


def _typed(value):
    """A field's contents with each value's Python type beside it (1 == 1.0 == True otherwise)."""
    if isinstance(value, list):
        return [(type(v), v) for v in value]
    return type(value), value


def assert_same_reading(path) -> None:
    ours, theirs = fast_reader_class()(str(path)), gguf.GGUFReader(str(path))
    assert type(ours) is not gguf.GGUFReader
    assert (ours.data_offset, ours.alignment, ours.byte_order, ours.endianess) == \
        (theirs.data_offset, theirs.alignment, theirs.byte_order, theirs.endianess)
    assert list(ours.fields) == list(theirs.fields)
    for key, want in theirs.fields.items():
        got = ours.fields[key]
        assert (got.name, got.offset, got.types) == (want.name, want.offset, want.types), key
        assert _typed(got.contents()) == _typed(want.contents()), key
        if want.types[-1] == gguf.GGUFValueType.STRING:  # one data index per string, as the package's
            assert len(got.data) == len(want.data), key

    def row(t):
        return (t.name, t.tensor_type, t.shape.dtype, t.shape.tolist(), t.n_elements, t.n_bytes, t.data_offset,
                t.data.dtype, t.data.shape)

    assert [row(t) for t in ours.tensors] == [row(t) for t in theirs.tensors]
    n = len(theirs.tensors)
    for i in sorted({0, n // 2, n - 1} if n else set()):
        assert ours.tensors[i].data.tobytes() == theirs.tensors[i].data.tobytes(), theirs.tensors[i].name


def test_the_embedded_model_reads_as_the_gguf_package_reads_it():
    """Tens of thousands of tokens, merges and token types: the arrays the fast path parses."""
    assert_same_reading(resolve_model(None))


BIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1, head_dim=64)
LONG = dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.3, 2.0, 4.0],
                             "long_factor": [1.5, 3.0, 7.0, 16.0]},
            original_max_position_embeddings=16, max_position_embeddings=4096)


def _kquants(path):
    raw = {g: (random_kquant_blocks(kind, r, c, seed=i), kind) for i, (g, kind, r, c) in enumerate(
        [("blk.0.attn_q.weight", "Q4_K", 256, 256), ("blk.0.attn_k.weight", "Q5_K", 128, 256),
         ("blk.0.ffn_up.weight", "Q6_K", 512, 256)])}
    write_tiny_gguf(path, tiny_hf_model("llama", **BIG), raw_blocks=raw)


# The files the loader tests write (tests/gguf_tiny.py, tests/gguf_families_tiny.py), one of each kind.
TINY = {
    "llama-f32": lambda p: write_tiny_gguf(p, tiny_hf_model("llama")),
    "llama-f16-extra-kv": lambda p: write_tiny_gguf(p, tiny_hf_model("llama"), qtype="F16",
                                                    extra_kv={"t.s": "text", "t.i": 7, "t.f": 0.25}),
    "llama-q8_0-rope-freqs": lambda p: write_tiny_gguf(p, tiny_hf_model("llama", **BIG), qtype="Q8_0",
                                                       rope_freqs=np.linspace(1, 8, 32)),
    "llama-kquants": _kquants,
    "qwen2": lambda p: write_tiny_gguf(p, tiny_hf_model("qwen2"), arch="qwen2"),
    "qwen3": lambda p: write_family_gguf(p, tiny_hf_model("qwen3"), "qwen3"),
    "gemma": lambda p: write_family_gguf(p, tiny_hf_model("gemma", n_kv=1, tied=True), "gemma"),
    "gemma2": lambda p: write_family_gguf(p, tiny_hf_model("gemma2", sliding_window=6, tied=True), "gemma2"),
    "gemma3": lambda p: write_family_gguf(p, tiny_hf_model("gemma3_text", n_kv=1, sliding_window=6,
                                                           num_hidden_layers=6), "gemma3_text"),
    "phi3-longrope": lambda p: write_family_gguf(p, tiny_hf_model("phi3", **LONG), "phi3"),
}


@pytest.mark.parametrize("kind", sorted(TINY))
def test_the_tests_tiny_files_read_as_the_gguf_package_reads_them(tmp_path, kind):
    path = tmp_path / f"{kind}.gguf"
    TINY[kind](path)
    assert_same_reading(path)


def _arrays_file(path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("t.strings", ["a", "", "ünï", "x" * 300])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False])
    w.add_array("t.nested", [[1, 2], [3]])  # arrays of arrays: the package's own walk
    w.add_string("t.text", "ok")
    w.add_tensor("x", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_every_kind_of_array_reads_as_the_gguf_package_reads_it(tmp_path):
    f = tmp_path / "arrays.gguf"
    _arrays_file(f)
    assert_same_reading(f)


def test_empty_arrays_read_as_the_gguf_package_reads_them(tmp_path):
    """GGUF version 3, no tensors, an empty array of strings, of numbers, of arrays, then a string
    (that its offset is read right shows the empty arrays took their 12 bytes)."""
    def key(name: str) -> bytes:
        return struct.pack("<Q", len(name)) + name.encode()

    string, array = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
    empties = [key(f"t.empty_{sub.name.lower()}") + struct.pack("<IIQ", array, sub, 0)
               for sub in (string, gguf.GGUFValueType.UINT32, array)]
    f = tmp_path / "empty.gguf"
    f.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(empties) + 1) + b"".join(empties)
                  + key("t.after") + struct.pack("<IQ", string, 2) + b"ok")
    assert_same_reading(f)
    assert fast_reader_class()(str(f)).fields["t.after"].contents() == "ok"


@pytest.mark.parametrize("where", ["strings", "numbers"])
def test_a_file_cut_inside_an_array_is_refused(tmp_path, monkeypatch, where):
    """Read short, the array would end early and the fields after it would be parsed from the wrong
    bytes: the reader names the array that runs past the end instead."""
    monkeypatch.setattr(gguf_fast_reader, "installed_gguf_version", lambda: CHECKED_GGUF_VERSIONS[0])
    f = tmp_path / "cut.gguf"
    _arrays_file(f)
    data = f.read_bytes()
    if where == "strings":
        cut = data.index(b"x" * 300) + 100  # inside the last string of t.strings
    else:
        cut = data.index(b"t.ints") + len("t.ints") + 4 + 4 + 8 + 4  # value type, item type, count, one value
    f.write_bytes(data[:cut])
    with pytest.raises(ValueError, match="not a readable GGUF file.*runs past the end of the file"):
        open_gguf(f)


def test_an_unlisted_gguf_version_opens_files_with_the_package_reader(tmp_path, monkeypatch):
    choice = reader_choice("0.0.0-unchecked")
    assert choice.reader is gguf.GGUFReader and not choice.fast
    assert "0.0.0-unchecked" in choice.reason and CHECKED_GGUF_VERSIONS[0] in choice.reason
    listed = reader_choice(CHECKED_GGUF_VERSIONS[0])
    assert listed.reader is fast_reader_class() and listed.fast

    monkeypatch.setattr(gguf_fast_reader, "installed_gguf_version", lambda: "0.0.0-unchecked")
    f = tmp_path / "arrays.gguf"
    _arrays_file(f)
    assert type(open_gguf(f)) is gguf.GGUFReader


def test_the_installed_gguf_is_a_checked_version():
    """Not a failure when it is not (the package's reader is used), but a prompt: the comparisons
    above ran against the fast reader on this version; when they pass, list it."""
    version = gguf_fast_reader.installed_gguf_version()
    if version not in CHECKED_GGUF_VERSIONS:
        pytest.skip(f"gguf {version} is not in CHECKED_GGUF_VERSIONS {CHECKED_GGUF_VERSIONS}: the package's reader "
                    "is in use; list it if this file's comparisons pass")
    assert reader_choice().fast
