"""The compiled batch engine (llamablock.fast.compiled.batch_compiled): a request decoded among others by the
static layout's step for B rows computes what it computes alone.

The reference is EagerEngine, one sequence at a time (itself tested against transformers). The
step for B rows runs eagerly here (StaticEngine(batch=B): the program's own graph, not compiled);
tests/faces/test_compile_cli.py builds it with `llamablock compile --batch` and runs the same check
on the AOTInductor program. Tolerances: the static layout fuses matmuls
and softmaxes over the slots up to the longest row's (exact zeros past a row's position), so float32 logits agree to
1e-5 of the largest as in test_compiled_decode.py; greedy tokens must be equal.
"""

import torch
from batch_driver import assert_each_alone, batched

from llamablock.fast.compiled.batch_compiled import CompiledBatchEngine
from llamablock.fast.compiled.static_decode import StaticDecoder
from llamablock.fast.compiled.static_engine import StaticEngine

LOGIT_RTOL = 1e-5

# (prompt length, new tokens, arrival step): six requests through three compiled rows, so rows are
# freed and taken again; the 60 + 70 tokens of the last are more than the 64-slot cache holds, so
# it runs in the eager batch beside the compiled rows (as do requests that find every compiled row taken).
REQUESTS = [(7, 30, 0), (3, 12, 0), (41, 10, 2), (12, 25, 5), (1, 8, 9), (60, 70, 14)]


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n, _, _ in REQUESTS]


@torch.no_grad()
def test_rows_at_their_own_positions_equal_each_row_alone(tiny):
    """StaticDecoder.step with one position per row: row i at pos[i] gives the logits that a
    one-row layout gives at that position (so a row's mask, RoPE angle and cache slot are its own)."""
    g = torch.Generator().manual_seed(0)
    lengths = [5, 17, 9]
    prompts = [torch.randint(0, tiny.cfg.vocab_size, (1, n), generator=g) for n in lengths]
    batch = StaticDecoder(tiny, 64, batch=3)
    singles = [StaticDecoder(tiny, 64) for _ in lengths]
    for i, (ids, one) in enumerate(zip(prompts, singles, strict=True)):
        one.prefill(ids)
        for layer in range(tiny.cfg.n_layers):  # the rows' prompts, each from slot 0
            batch.cache.keys[layer][i] = one.cache.keys[layer][0]
            batch.cache.values[layer][i] = one.cache.values[layer][0]
    tokens = torch.tensor([[3], [4], [5]])
    got = batch.step(tokens, torch.tensor(lengths))
    for i, one in enumerate(singles):
        want = one.step(tokens[i:i + 1], torch.tensor([lengths[i]]))
        torch.testing.assert_close(got[i:i + 1], want, atol=1e-5, rtol=0)


def test_compiled_rows_equal_each_request_alone(tiny):
    """Requests joining, leaving and taking freed rows (a row leaving before the last makes the last
    move into its place), steps at one row and at three, one request too long for the compiled rows
    (it decodes in the eager batch in the same steps): every answer equals its run alone."""
    static = StaticEngine(tiny, batch=3)
    static.prepare(64)
    engine = CompiledBatchEngine(tiny, static, chunk=16)
    prompts = _prompts(tiny.cfg.vocab_size)
    sizes, buckets, moves = [], [], []
    step, step_bucket, remove = engine.step, static.step_bucket, engine.remove
    engine.step = lambda t: (sizes.append((sum(r is not None for r in engine.slots), len(engine.eager.rows))), step(t))[1]
    static.step_bucket = lambda ids, pos: (buckets.append(ids.shape[0]), step_bucket(ids, pos))[1]
    engine.remove = lambda row: (moves.append(row.index is not None and row.index < sum(
        r is not None for r in engine.slots) - 1 and engine.slots[row.index] is row), remove(row))[1]
    got = batched(engine, prompts, REQUESTS)
    assert_each_alone(got, tiny, prompts, REQUESTS, LOGIT_RTOL)
    assert max(c for c, _ in sizes) == 3 and max(e for _, e in sizes) >= 1  # all compiled rows used; eager rows beside
    assert set(buckets) == {1, 3} and any(moves)  # the one-row step ran, and a row moved into a gap


def test_the_one_row_bucket_is_the_package_generate_builds(tiny):
    """A batch engine's one-row step names the same AOTInductor package as the one-sequence
    engine's step at the same cache length (same weights, shapes, settings), so `compile` and
    `compile --batch B` share it. Keys only: nothing is compiled."""
    from llamablock.fast.compiled.aoti_step import package_key, weights_digest
    from llamablock.fast.compiled.build_options import attempts

    one, batch = StaticEngine(tiny), StaticEngine(tiny, batch=3)
    one.prepare(64)
    batch.prepare(64)
    view, _ = batch._bucket(1)
    options = attempts("float32", "step", False, None)[0].options
    keys = [package_key(static, "float32", options, "step", (torch.zeros(1, 1, dtype=torch.long),
                                                             torch.zeros(1, dtype=torch.long)), weights_digest(static))
            for static in (one.static, view)]
    assert keys[0] == keys[1]
    three = package_key(batch.static, "float32", options, "step", (torch.zeros(3, 1, dtype=torch.long),
                                                                    torch.zeros(3, dtype=torch.long)))
    assert three != keys[0]
