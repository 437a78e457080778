"""A GGUF file's metadata as typed values: a field of the wrong type is an error that names it.

GGUF types every value (uint32, float32, string, array...), but a careless or hostile writer can
store an epsilon as the string "1e-5", a base as a string, or a scalar setting as an array. Python
would convert the first two silently (`float("1e-5")`), and a loader that skipped array fields would
let a key's default take the array's place; llama.cpp refuses such files when it reads the key with
its type.
`number` reads a numeric key the same way: the value must already be a number of that kind.
"""

from __future__ import annotations

import math

REQUIRED = object()


class Metadata(dict):
    """The file's scalar and string metadata (key -> value); `arrays` names the keys that hold
    arrays (the tokenizer's vocabulary...), which are not copied here."""

    arrays: frozenset[str] = frozenset()


def read_metadata(reader) -> Metadata:
    """All scalar and string metadata of a gguf.GGUFReader, and the names of its array fields."""
    import gguf

    out, arrays = Metadata(), set()
    for key, field in reader.fields.items():
        if not field.types:
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            arrays.add(key)
        else:
            out[key] = field.contents()
    out.arrays = frozenset(arrays)
    return out


def number(meta: dict, key: str, kind: type = float, default=REQUIRED, *, positive: bool = False):
    """meta[key] as an int (`kind` int: an integer type in the file) or a float (any number),
    `default` when absent (an error naming the key when there is none); never converted from a
    string, an array or a flag. `positive`: it must also be > 0."""
    if key in getattr(meta, "arrays", ()):
        raise ValueError(f"GGUF metadata {key} must be a single number, the file holds an array")
    value = meta.get(key)
    if value is None:
        if default is REQUIRED:
            raise ValueError(f"GGUF metadata lacks {key}, needed to build the model")
        if default is None or not positive or default > 0:
            return default
        raise ValueError(f"GGUF metadata lacks {key}, and the value it defaults to ({default!r}) is not positive")
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        what = "an integer" if kind is int else "a finite number"
        raise ValueError(f"GGUF metadata {key} must be {what}, got {value!r} ({type(value).__name__})")
    if positive and not value > 0:
        raise ValueError(f"GGUF metadata {key} must be positive, got {value!r}")
    return kind(value)


def field_array(reader, key: str) -> list | None:
    """An array metadata field as a Python list, or None when the file lacks it."""
    field = reader.get_field(key)
    return None if field is None else field.contents()
