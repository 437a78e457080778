"""The bound a 16-bit KV cache keeps the logits within (fast/plan.py kv_dtype), for the eager
(tests/runtime/test_kv_dtype.py) and the compiled engines (tests/fast/compiled/test_kv_dtype_compiled.py).

The bound: a 16-bit cache rounds each cached key and value once, to p significant bits (bfloat16 8,
float16 11), a relative error of at most u = 2^-p. Attention reads them upcast to float32, so the
rest is computed as before: a value's error reaches the output as a convex combination of errors
of at most u of the values' size, a key's moves each score by at most u of its size (the softmax
then by about as much), and the layers and the residual stream add these up to a few u of the
logits' scale. Tested: max |logits - float32 cache's| <= 4 u max |logits| over a prompt and the
steps after it, on a two-layer model (what it measured is printed with -s). The bound alone would
let a cache round coarser than asked in part (keys alone in bfloat16 stay within float16's), so the
contents are checked exactly too: layer 0's keys and values, computed before any cache is read, are
the float32 cache's rounded once to the 16-bit type (`assert_rounded_once`).
"""

from __future__ import annotations

import torch

UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}  # u = 2^-p, p the significant bits


def logits_along(engine, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """(1 + n - prompt, V): the prefill's logits of ids[:, :prompt], then each step's over the rest."""
    engine.prepare(ids.shape[1] + 1)
    out = [engine.prefill(ids[:, :prompt])]
    out += [engine.step(ids[:, p:p + 1], p) for p in range(prompt, ids.shape[1])]
    return torch.cat(out).float()


def assert_within_bound(got: torch.Tensor, want: torch.Tensor, kv: torch.dtype) -> None:
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    print(f"{kv}: max |difference| {err:.3g} = {err / scale / UNIT[kv]:.2f} u of the logits' scale {scale:.3g}")
    assert 0 < err <= 4 * UNIT[kv] * scale, (err, scale)  # 0: the cache rounded nothing, so it is not 16-bit


def assert_rounded_once(cache16: list[torch.Tensor], cache32: list[torch.Tensor], kv: torch.dtype) -> None:
    """Layer 0's keys and values (the first two tensors of each list) in the 16-bit cache equal the
    float32 cache's rounded to `kv`, slot for slot (a tensor may hold more slots than the other)."""
    for got, want in zip(cache16[:2], cache32[:2], strict=True):
        n = min(got.shape[2], want.shape[2])
        assert got.dtype == kv and torch.equal(got[:, :, :n], want[:, :, :n].to(kv))
