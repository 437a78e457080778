"""io/gguf_fast_reader.py: the fields of gguf.GGUFReader, parsed a faster way (`fast_reader_class`).

Reference: the `gguf` package's own GGUFReader, unchanged, on the same files. Every field's
contents and types must be equal, and a file cut inside an array must be refused, not read short.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from llamablock.io.gguf import open_gguf
from llamablock.io.resolve import resolve_model


def _same_fields(path) -> None:
    ours, theirs = open_gguf(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        got, want = ours.fields[key].contents(), field.contents()
        assert type(got) is type(want) and got == want, key
        assert ours.fields[key].types == field.types, key
    assert [(t.name, t.data_offset, t.n_bytes) for t in ours.tensors] == \
        [(t.name, t.data_offset, t.n_bytes) for t in theirs.tensors]


def test_the_embedded_model_reads_as_the_gguf_package_reads_it():
    """49,152 tokens, 48,900 merges, token types: the arrays the fast path parses."""
    _same_fields(str(resolve_model(None)))


def _arrays_file(path) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("t.strings", ["a", "", "ünï", "x" * 300])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False])
    w.add_array("t.empty", [])
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
    _same_fields(str(f))


@pytest.mark.parametrize("where", ["strings", "numbers"])
def test_a_file_cut_inside_an_array_is_refused(tmp_path, where):
    """Read short, the array would end early and the fields after it would be parsed from the wrong
    bytes: the reader names the array that runs past the end instead."""
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
