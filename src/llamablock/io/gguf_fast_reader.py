"""A faster parse of a GGUF header: `gguf.GGUFReader` with two of its private methods replaced.

Why it exists. The package's reader slices its memory map into numpy views, several per metadata
item, so a tokenizer's arrays (a vocabulary and its merges, tens of thousands of entries each)
cost several views per entry, most of its header parse's time (cProfile). The parse is part of
the "read the model" stage that benchmarks/bench_startup.py (`llamablock bench startup`) times
in a warm `llamablock generate`. This reader gives the same fields and tensors, two ways faster:
  * the byte view is a plain ndarray over the map, not a np.memmap, whose every slice runs
    memmap.__array_finalize__ in Python (so a tensor's `.data` is an ndarray view too);
  * an array of numbers is one view of all its values, and an array of strings one memoryview
    slice per string (`contents()` needs only `.tobytes()` of each), its lengths read with
    struct, not a numpy view each.
What differs is the layout of an array field's `parts` and `data` indices, not what they hold:
`contents()` of every field is the package's, but `contents(i)` of an array of numbers indexes
the one view and is not the package's answer. Every caller here reads whole fields.

Why a version list. `_build_fields` and `_get_field_parts`, and the `_get`, `gguf_scalar_to_np`
and `byte_order` they use, are the package's internals ("API may change", its source says).
`CHECKED_GGUF_VERSIONS` lists the versions whose internals this reader matches, shown field by
field against the package's own reader by tests/io/test_gguf_fast_reader.py; on any other
installed version `reader_choice` picks the package's own reader (correct, slower) and says why.
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

import numpy as np

# The gguf package versions whose reader internals this module matches: their private methods
# read, their fields compared with the package's own (tests/io/test_gguf_fast_reader.py). List a
# version only once that test passes against it.
CHECKED_GGUF_VERSIONS: tuple[str, ...] = ("0.19.0",)


class ReaderChoice(NamedTuple):
    """The reader class `open_gguf` uses, whether it is this module's, and why (one line)."""

    reader: type
    fast: bool
    reason: str


@functools.cache
def installed_gguf_version() -> str:
    """The installed gguf package's version, or "unknown" when its metadata cannot be read."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"


def reader_choice(version: str | None = None) -> ReaderChoice:
    """Which reader parses GGUF headers with gguf `version` (default: the installed one), and why.

    The fast reader for a checked version; otherwise the package's own `gguf.GGUFReader`, since
    private methods of an unchecked version may have changed meaning without changing names."""
    import gguf

    version = installed_gguf_version() if version is None else version
    if version in CHECKED_GGUF_VERSIONS:
        return ReaderChoice(fast_reader_class(), True,
                            f"fast GGUF reader (io/gguf_fast_reader.py), checked against gguf {version}")
    return ReaderChoice(gguf.GGUFReader, False,
                        f"gguf.GGUFReader (correct, slower header parse): gguf {version} is not among the versions "
                        f"the fast reader was checked against ({', '.join(CHECKED_GGUF_VERSIONS)})")


@functools.cache
def fast_reader_class() -> type:
    """The `gguf.GGUFReader` subclass (built on first use: importing gguf is left to the caller's
    first GGUF file). Use `reader_choice().reader` to open files; this class is for the tests."""
    import gguf

    array, string = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING

    class FastGGUFReader(gguf.GGUFReader):
        def _build_fields(self, offs, count):
            self.data = self.data.view(np.ndarray)  # slices skip memmap.__array_finalize__
            return super()._build_fields(offs, count)

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type != array or self.byte_order != "I":
                return super()._get_field_parts(orig_offs, raw_type)
            itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
            if itype.size != 1 or alen.size != 1:
                raise ValueError(f"the array at byte {orig_offs:,} runs past the end of the file")
            sub, n, offs = gguf.GGUFValueType(int(itype[0])), int(alen[0]), orig_offs + 12
            if n == 0:  # the package types an empty array [ARRAY] alone, with no item type
                return super()._get_field_parts(orig_offs, raw_type)
            nptype = self.gguf_scalar_to_np.get(sub)
            if nptype is not None:
                values = self._get(offs, nptype, n)
                if values.size != n:
                    raise ValueError(f"the array at byte {orig_offs:,} runs past the end of the file")
                return 12 + int(values.nbytes), [itype, alen, values], [2], [array, sub]
            if sub != string:  # arrays of arrays: the reader's own walk
                return super()._get_field_parts(orig_offs, raw_type)
            mv, parts, length = memoryview(self.data), [itype, alen], struct.Struct("<Q").unpack_from
            for _ in range(n):  # struct.error past the end of the file
                start = offs + 8
                offs = start + length(mv, offs)[0]
                parts.append(mv[start:offs])
            if offs > len(mv):
                raise ValueError(f"the array of strings at byte {orig_offs:,} runs past the end of the file")
            return offs - orig_offs, parts, list(range(2, 2 + n)), [array, string]

    return FastGGUFReader
