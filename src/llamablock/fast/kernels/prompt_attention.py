"""A prompt's causal attention in chunks of queries, each group's query heads stacked: the eager engine's prefill.

llamablock.attention runs a causal prefill through torch's scaled_dot_product_attention, whose CPU
flash kernel takes one query head at a time (a block of its queries against blocks of keys, the
softmax kept running). Here, for each chunk of CHUNK queries, the g query heads that share a
key-value head are stacked into one (g * CHUNK, hd) matrix and meet the keys up to the chunk's end
in one matmul: each key is read once a chunk for all g heads, in GEMMs of g * CHUNK rows. The chunk's
own diagonal block is masked above its diagonal, each row takes a softmax, and one more matmul
weighs the values. Keys after a chunk are never read, so the products skip the causal half but for
the chunk's width. Memory: one chunk's scores, (b, n_kv, g * CHUNK, t) float32, linear in t.

`llamablock bench prompt_attention` times both by prompt length and head shape (and the 1B
prefill beside llama.cpp's is `bench size`'s): the chunks ran ahead of torch's kernel from about
FROM tokens; past UP_TO a chunk's rows of scores outgrow the caches and torch's kernel, which splits
the keys too, is level or ahead, so `covers` takes prompts of FROM to UP_TO tokens. The result equals
SDPA's to float32 rounding (the sums run in another order), within the bound
tests/fast/kernels/test_prompt_attention.py states against a float64 reference.

The compiled engine over a file's blocks prefills with one program for every prompt length, which
cannot loop over t in Python: it calls the kernel's operator (block_op.cpp prompt_attention), the
same ATen calls in C++ with CHUNK, FROM and UP_TO passed in, which takes the chunks or SDPA by t at
run time; the operator and `chunked_causal` give the same bits (the tests).
"""

from __future__ import annotations

import torch
from torch import nn

CHUNK = 32  # queries a chunk: the fastest of 16 to 128 at 512 tokens (bench prompt_attention's chunk table)
FROM, UP_TO = 256, 1024  # prompt lengths `covers` takes (the module docstring)


def chunked_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T scale + causal mask) v for q (b, h, t, hd) and k, v (b, n_kv, t, hd), float32,
    query i seeing keys 0..i; h a multiple of n_kv, the g = h / n_kv heads of a group adjacent (the
    layout of Attention's projections). Returns (b, h, t, hd)."""
    b, h, t, hd = q.shape
    n_kv = k.shape[1]
    g = h // n_kv
    out = q.new_empty(q.shape)  # contiguous, as the compiled engine's operator returns it (block_op.cpp)
    qg = (q * scale).view(b, n_kv, g, t, hd)  # scaled once: scaling each chunk's scores costs a pass over them
    og = out.view(b, n_kv, g, t, hd)
    above = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu_(1)  # (CHUNK, CHUNK): key after query
    for a in range(0, t, CHUNK):
        e = min(a + CHUNK, t)
        c = e - a
        scores = qg[:, :, :, a:e].reshape(b, n_kv, g * c, hd) @ k[:, :, :e].transpose(-1, -2)  # (b, n_kv, g*c, e)
        scores.view(b, n_kv, g, c, e)[..., a:e].masked_fill_(above[:c, :c], float("-inf"))
        og[:, :, :, a:e] = (torch.softmax(scores, -1) @ v[:, :, :e]).view(b, n_kv, g, c, hd)
    return out


class PromptReader:
    """What `attach` gives an Attention layer: `covers` says whether a causal call is one it takes."""

    def covers(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """A float32 prompt on the CPU of FROM..UP_TO tokens from the cache's start (keys as many as queries), no
        gradient (a training step keeps SDPA's backward), not under torch.compile (a loop over t). (A layer
        that soft-caps its scores never asks: Attention.attend refuses its causal call first.)"""
        return (FROM <= q.shape[2] <= UP_TO and k.shape[2] == q.shape[2] and q.device.type == "cpu"
                and q.dtype == torch.float32 and k.dtype == torch.float32 and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling())

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return chunked_causal(q, k, v, scale)


def attach(model: nn.Module) -> None:
    """Give each attention layer of an eager engine's `model` the prompt reader."""
    from llamablock.attention import Attention

    reader = PromptReader()
    for module in model.modules():
        if isinstance(module, Attention):
            module.prompt_reader = reader
