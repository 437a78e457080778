"""The decode step reads only the filled part of its static cache: slots 0 .. max(pos), not all L.

How it is seen: slots after the step's position (after the longest row's, for a batch) hold NaN, and
the logits stay finite and equal to the reference. Reading them would not survive masking: a masked
score is -inf, its probability 0, and 0 * NaN in the weighted sum of values is NaN. Positions: an
early slot (a padded prompt), a middle one and the cache's last (L - 1). References and tolerances
as in test_compiled_decode.py and test_kv_dtype_compiled.py: the eager Decoder for a float32 cache
(1e-5 for the static layout run eagerly, 1e-4 for a compiled program), and for a 16-bit cache the
eager Decoder within tests/kv16_bound.py's bound and, for a compiled program, the static layout with
the same cache run eagerly on clean slots (1e-4). Each program is compiled with autotune off (a few seconds each).
"""

import pytest
import torch
from kv16_bound import assert_within_bound

from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.compiled.static_decode import StaticDecoder
from llamablock.fast.compiled.static_engine import StaticEngine

LENGTH = 256  # the engines' smallest cache (static_decode.MIN_CACHE)
POSITIONS = (7, 130, LENGTH - 1)  # early (prompt padded to the prefill's minimum), middle, the last slot


@pytest.fixture(scope="module")
def ids(tiny):
    return torch.randint(0, tiny.cfg.vocab_size, (1, LENGTH), generator=torch.Generator().manual_seed(0))


def _poison(cache, first: int) -> None:
    """NaN in every slot from `first` on, every row and layer."""
    for t in cache.tensors():
        t[:, :, first:] = float("nan")


@torch.no_grad()
def _steps(engine, ids, poison: bool) -> list[torch.Tensor]:
    """At each of POSITIONS p: prefill ids[:, :p], NaN from slot p on (when `poison`), step at p -> logits (1, V)."""
    out = []
    for p in POSITIONS:
        engine.prefill(ids[:, :p])
        if poison:
            _poison(engine.static.cache, p)
        out.append(engine.step(ids[:, p:p + 1], p).float())
    return out


@torch.no_grad()
def _decoder(model, ids) -> list[torch.Tensor]:
    return [model(ids[:, :p + 1], last_only=True)[:, -1] for p in POSITIONS]


@pytest.mark.parametrize("kv", [torch.float32, torch.bfloat16])
def test_the_static_step_reads_only_the_filled_slots(tiny, ids, kv):
    """The static layout run eagerly (the graph the programs are traced from)."""
    got = _steps(StaticEngine(tiny, "float32", kv_dtype=kv), ids, poison=True)
    for g, w in zip(got, _decoder(tiny, ids), strict=True):
        assert torch.isfinite(g).all()
        if kv == torch.float32:
            torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
        else:
            assert_within_bound(g, w, kv)


@pytest.mark.slow
@pytest.mark.parametrize("kv", [torch.float32, torch.bfloat16])
def test_the_compiled_step_reads_only_the_filled_slots(tiny, ids, kv):
    """The AOTInductor step (one program for every position) and prefill."""
    torch._dynamo.reset()
    engine = AOTIEngine(tiny, "float32", autotune=False, kv_dtype=kv)
    engine.prepare(LENGTH)
    assert engine.length == LENGTH and {engine.running.get(m) for m in ("step", "prefill")}.isdisjoint({None, "eager"})
    got = _steps(engine, ids, poison=True)
    want = _decoder(tiny, ids) if kv == torch.float32 else _steps(StaticEngine(tiny, "float32", kv_dtype=kv), ids, False)
    for g, w, exact in zip(got, want, _decoder(tiny, ids), strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)
        if kv != torch.float32:
            assert_within_bound(g, exact, kv)


def _rows(tiny, ids, positions, batch):
    """A batch layout whose row i holds ids[i]'s first positions[i] tokens (from one-row layouts), slots
    after the longest row NaN; and the one-row layouts."""
    singles = [StaticDecoder(tiny, LENGTH) for _ in positions]
    for i, (p, one) in enumerate(zip(positions, singles, strict=True)):
        one.prefill(ids[i:i + 1, :p])
        for layer in range(tiny.cfg.n_layers):
            batch.cache.keys[layer][i] = one.cache.keys[layer][0]
            batch.cache.values[layer][i] = one.cache.values[layer][0]
    _poison(batch.cache, max(positions) + 1)
    return singles


@torch.no_grad()
@pytest.mark.parametrize("compiled", [False, True])
def test_a_batch_step_reads_up_to_its_longest_row(tiny, compiled):
    """Rows at different positions: the step reads the slots up to the longest row's position (a shorter
    row masks the rest, which holds finite numbers), and each row equals its one-row layout."""
    torch._dynamo.reset()
    positions = [5, 200, 17]
    ids = torch.randint(0, tiny.cfg.vocab_size, (3, LENGTH), generator=torch.Generator().manual_seed(1))
    engine = (AOTIEngine(tiny, "float32", autotune=False, batch=3) if compiled else StaticEngine(tiny, batch=3))
    engine.prepare(LENGTH)
    singles = _rows(tiny, ids, positions, engine.static)
    tokens = torch.stack([ids[i, p:p + 1] for i, p in enumerate(positions)])  # (3, 1)
    got = engine.step_rows(tokens, torch.tensor(positions))
    assert torch.isfinite(got).all()
    for i, (p, one) in enumerate(zip(positions, singles, strict=True)):
        want = one.step(tokens[i:i + 1], torch.tensor([p]))
        torch.testing.assert_close(got[i:i + 1], want, atol=1e-4 if compiled else 1e-5, rtol=0)
