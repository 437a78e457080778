"""The weight formats, in one table: their names, the dtype each loads in, and which format a
file's own types map to.

A *format* is how a model's weights are held while it runs (the commands' `--dtype` flag names
one, or `auto`):
    float32, bfloat16   plain tensors of that dtype
    q8, q4              packed int8 rows / int4 groups of 32 (fast/kernels/quant.py), with bfloat16
                        activations, the dtype the packed CPU kernels take; loaded in bfloat16,
                        then quantized
    blocks              a GGUF's own blocks as stored (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K:
                        fast/kernels/file_blocks.py),
                        float32 activations; what `auto` runs such a file in
`auto` is each tensor in the format its stored type maps to (GGUF_TYPES; fast/kernels/native.py), or a
transformers directory's torch_dtype (TORCH_DTYPES). Why 5- and 6-bit blocks go to q8 rather
than q4: the file's precision is kept at some memory cost.
"""

from __future__ import annotations

import torch

FORMATS = ("float32", "bfloat16", "q8", "q4", "blocks")
PACKED = ("q8", "q4")  # quantized by fast/kernels/quant.py after loading in bfloat16
CHOICES = ("auto", *FORMATS)  # what a command's --dtype takes

# A GGUF tensor type -> the format it runs in under `auto`.
GGUF_TYPES = {"F32": "float32", "F16": "bfloat16", "BF16": "bfloat16", "Q8_0": "q8", "Q5_0": "q8", "Q5_1": "q8",
              "Q5_K": "q8", "Q6_K": "q8", "Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4"}
# A config.json torch_dtype (transformers v5 calls it dtype) -> its format; float16 runs as bfloat16.
TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "bfloat16"}


def load_dtype(fmt: str) -> torch.dtype:
    """The torch dtype the weights are loaded in for `fmt` (the packed ones: bfloat16, then quantized;
    blocks: float32, the activations beside the file's blocks)."""
    if fmt not in FORMATS:
        raise ValueError(f"--dtype must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return torch.float32 if fmt in ("float32", "blocks") else torch.bfloat16


def dir_format(label: str, where: str) -> str:
    """The format of a directory's torch_dtype label (float16 runs as bfloat16); `where` names the
    file in the error."""
    if label not in TORCH_DTYPES:
        raise ValueError(f"{where} torch_dtype must be one of {sorted(TORCH_DTYPES)}, got {label!r}")
    return TORCH_DTYPES[label]
