"""A decode step's attention read in place from a 16-bit KV cache (c/cache_attention.c), for the eager engine.

llamablock.attention reads a float16 or bfloat16 cache upcast to float32: a copy of every filled
slot of every layer at every step, which grows with the context until it outweighs the attention's
own reads (`llamablock bench cache_attention` times both at several context lengths). `read_cache`
computes the same softmax(q k^T scale) v with each key and value converted as it is read: scores in
C, torch's softmax (the one the layer's own path calls), then the weighted values in C. `attach`
gives an eager model's attention layers this reader for the steps it covers (`covers`: one new token
of one sequence, a 16-bit cache, nothing masked, keys cached after rotation, no soft-capping); every
other call runs the layer's own code. Equal to the upcast path to float32 rounding (the sums run in
another order), within the bound tests/fast/kernels/test_cache_attention.py states. The compiled step
over a file's blocks calls the same C and softmax through an operator (block_op.cpp cache_attention):
given the same q, k and v the two give the same bits, and the static layout run eagerly gives the
eager engine's logits bit for bit (tests/fast/kernels/test_cache_attention.py).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from llamablock.fast.kernels import ggml_kernel

DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # c/cache_attention.c's LB_F32, LB_F16, LB_BF16
COVERED = (torch.float16, torch.bfloat16)  # the caches `attach`'s reader takes: those the layer would upcast


def read_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, threads: int | None = None,
               lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """(1, h, 1, hd) float32 = softmax(q k^T scale) v, for q (1, h, 1, hd) float32 and k, v (1, n_kv, n, hd)
    of one dtype in DTYPES (a cache's first n slots: views with the buffer's strides, hd contiguous)."""
    lib = lib or ggml_kernel.kernel()
    _, h, t, hd = q.shape
    n_kv, n = k.shape[1], k.shape[2]
    if (q.dtype != torch.float32 or k.dtype not in DTYPES or v.dtype != k.dtype or q.shape[0] != 1 or t != 1
            or k.shape != v.shape or k.shape[0] != 1 or k.shape[3] != hd or h % n_kv):
        raise ValueError(f"read_cache takes one float32 query token (1, h, 1, hd) and one sequence's keys and values "
                         f"(1, n_kv, n, hd) of one dtype of {', '.join(map(str, DTYPES))}; got q {tuple(q.shape)} "
                         f"{q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")
    if any(x.stride(3) != 1 or x.stride(2) != hd for x in (k, v)):
        raise ValueError("read_cache reads rows of hd contiguous elements, one slot after another")
    q = q.contiguous()
    threads = threads or torch.get_num_threads()
    scores = torch.empty(h, n)
    status = lib.lb_cache_scores(DTYPES[k.dtype], q.data_ptr(), k.data_ptr(), n_kv, h // n_kv, hd, k.stride(1), n,
                                 scale, scores.data_ptr(), threads)
    if status:
        raise _failed(status, h, n_kv, hd)
    probs = torch.softmax(scores, dim=-1)  # (h, n), as the layer's own path: llamablock.attention.Attention.attend
    out = torch.empty(1, h, 1, hd)
    status = lib.lb_cache_values(DTYPES[k.dtype], probs.data_ptr(), v.data_ptr(), n_kv, h // n_kv, hd, v.stride(1), n,
                                 out.data_ptr(), threads)
    if status:
        raise _failed(status, h, n_kv, hd)
    return out


def takes(hd: int, group: int) -> bool:
    """Whether the C takes heads of `hd` features with `group` queries to a key-value head (its check():
    a multiple of 16 features up to 512, at most 64 queries): the reader's and the compiled step's test."""
    return hd % 16 == 0 and 16 <= hd <= 512 and 1 <= group <= 64


def _failed(status: int, h: int, n_kv: int, hd: int) -> ValueError:
    return ValueError(f"the kernel's cache attention does not take {h} query heads over {n_kv} of {hd} features "
                      f"(status {status}: heads of a multiple of 16 features up to 512, at most 64 queries a group)")


class CacheReader:
    """The reader `attach` gives an Attention layer: `covers` says whether a call is one it takes."""

    def covers(self, layer: nn.Module, q: torch.Tensor, k: torch.Tensor, inputs) -> bool:
        return (q.shape[0] == 1 and q.shape[2] == 1 and q.dtype == torch.float32 and k.dtype in COVERED
                and inputs.bias is None and inputs.pad_bias is None and inputs.key_rope is None and not inputs.causal
                and layer.softcap is None and takes(layer.hd, layer.h // layer.n_kv))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return read_cache(q, k, v, scale)


def attach(model: nn.Module) -> bool:
    """Give each attention layer of `model` the cache reader, where the kernel built; True if it did."""
    from llamablock.attention import Attention

    if ggml_kernel.kernel() is None:
        return False
    reader = CacheReader()
    for module in model.modules():
        if isinstance(module, Attention):
            module.cache_reader = reader
    return True
