"""The server's eager batch engine steps a request decoding alone in C (runtime/batch.py `c_step`,
fast/decode_step.py), as `generate` does, and rows together in torch.

References: for a row alone from its start, generate's engine (DecodeStepEngine): the same prefill
(the eager model's) and the same C over the same cache bytes, so its logits are equal bit for bit.
For a row left alone by a longer one (its cache then has padding before it, dropped before the C
reads it), the batch engine's own torch steps on the same history, within test_decode_step.py's
bound (the C and the torch layers sum in other orders). Run on a Q4_K_M-mix file (Q4_K and Q6_K
blocks) with a float16 cache, the default for a quantized file.
"""

from __future__ import annotations

import pytest
import torch
from kv16_bound import UNIT, logits_along

from benchmarks.scaled_gguf import write_scaled
from llamablock.fast.decode_step import DecodeStep, DecodeStepEngine
from llamablock.fast.machine import this_machine
from llamablock.fast.plan import decide, load_gguf_native
from llamablock.io.resolve import resolve_model
from llamablock.io.source import open_source
from llamablock.runtime.batch import EagerBatchEngine
from llamablock.web.generation import load_served

KV = torch.float16
BOUND = 4 * max(UNIT[KV], 2.0**-15)  # test_decode_step.py's bound for a float16 cache

pytestmark = pytest.mark.skipif(not this_machine().kernel, reason="the block kernel does not build here")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_scaled(resolve_model(None), tmp_path_factory.mktemp("mix") / "q4km.gguf", 256, 2, 4, 2, 512,
                        mix="Q4_K_M")


@pytest.fixture(scope="module")
def model(path):
    return load_gguf_native(path)[0]


def _ids(model, n: int, seed: int) -> list[int]:
    return torch.randint(0, model.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _steps(engine: EagerBatchEngine, tokens: list[list[int]]) -> list[torch.Tensor]:
    """A step for each of tokens[i]'s tokens, row i taking tokens[i][s] at step s: each step's logits (b, V)."""
    return [engine.step(torch.tensor(column)) for column in zip(*tokens, strict=True)]


@torch.no_grad()
def test_a_request_alone_steps_as_generate_bit_for_bit(model):
    ids = _ids(model, 48, 0)
    want = logits_along(DecodeStepEngine(model, kv_dtype=KV), torch.tensor([ids]), 20)  # (1 + 28, V)
    engine = EagerBatchEngine(model, rows=4, kv_dtype=KV, c_step=DecodeStep(model, KV))
    row = engine.add(ids[:20], 28)
    got = [engine.prefill(row), *_steps(engine, [ids[20:]])]
    assert engine.c_step.cache is engine.cache  # the steps ran in C, over the batch's own buffers
    assert torch.equal(torch.cat(got), want)


@torch.no_grad()
def test_a_request_left_alone_steps_in_c_within_the_bound_of_torchs_steps(model):
    """Two rows decode together (torch), the longer leaves, the shorter goes on alone: in C (its
    padding dropped first) against the same engine without a C step."""
    long_ids, short_ids = _ids(model, 60, 1), _ids(model, 40, 2)
    runs = []
    for c_step in (None, DecodeStep(model, KV)):
        engine = EagerBatchEngine(model, rows=2, kv_dtype=KV, c_step=c_step)
        rows = [engine.add(long_ids[:30], 30), engine.add(short_ids[:10], 30)]
        for r in rows:
            engine.prefill(r)
        together = _steps(engine, [long_ids[30:34], short_ids[10:14]])  # the short row: slots 20..33 of 34
        engine.remove(rows[0])
        assert engine._waste() > 0  # padding before the short row: the C must not read it
        alone = _steps(engine, [short_ids[14:34]])
        runs.append((together, alone, engine))
    (t_torch, a_torch, _), (t_c, a_c, engine) = runs
    assert all(torch.equal(a, b) for a, b in zip(t_torch, t_c, strict=True))  # together: torch's steps both
    assert engine.c_step.cache is engine.cache and engine._waste() == 0
    got, want = torch.cat(a_c), torch.cat(a_torch)
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    print(f"alone after a leave: max |difference| {err:.3g} = {err / scale:.2e} of the logits' scale")
    assert err <= BOUND * scale, (err / scale, BOUND)


@torch.no_grad()
def test_an_idle_engine_and_its_c_step_hold_no_cache(model):
    engine = EagerBatchEngine(model, rows=2, kv_dtype=KV, c_step=DecodeStep(model, KV))
    ids = _ids(model, 12, 3)
    row = engine.add(ids[:8], 4)
    engine.prefill(row)
    _steps(engine, [ids[8:]])
    engine.remove(row)
    assert engine.cache is None and engine.c_step.cache is None and engine.c_step.work is None
    with pytest.raises(ValueError, match="outside the bound KV cache"):  # unbound: refused, not a stale pointer
        engine.c_step(torch.zeros(model.cfg.d_model), 0)


def test_serve_gives_its_eager_rows_the_plans_c_step(path):
    plan = decide(open_source(path), "auto", "eager", batch=2)
    assert plan.c_step and "a server decodes with the batch engine (a request alone: its steps in C)" in plan.describe()
    served = load_served(str(path), engine="eager", parallel=2)
    try:
        assert isinstance(served.worker.engine.c_step, DecodeStep)
    finally:
        served.worker.close()
