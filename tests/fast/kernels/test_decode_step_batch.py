"""The server's eager batch engine steps its rows in C (runtime/batch.py `c_step`, fast/decode_step.py),
as `generate` steps one sequence: one call for all the rows, each row attending to its own slots.

Reference: generate's engine (DecodeStepEngine) on each row's tokens alone: the same prefill (the
eager model's), the same cache bytes, and the same C, whose products give a row the sums it gets
alone (linear.c splits weight rows, never an input row) and whose attention reads the row's own
slots in the same order, so each row's logits are equal bit for bit, whatever rows step beside it,
join (a longer prompt shifts the rows right), leave (the last row moves into the gap) or left
padding before it. Run on a Q4_K_M-mix file (Q4_K and Q6_K blocks) with a float16 cache, the
default for a quantized file.
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
def test_rows_together_step_each_as_generate_alone_bit_for_bit(model):
    """Rows A and B (prompts of 20 and 8) step together; C (a prompt of 40, past the frontier) joins and
    the rows shift right, the buffers grow from 2 rows to 4; A leaves and C moves into its row; B is
    left alone with padding before it. Each row's logits against its own DecodeStepEngine run."""
    ids = {name: _ids(model, n, seed) for name, n, seed in (("A", 36, 1), ("B", 40, 2), ("C", 56, 3))}
    prompt = {"A": 20, "B": 8, "C": 40}
    want = {name: logits_along(DecodeStepEngine(model, kv_dtype=KV), torch.tensor([row]), prompt[name])
            for name, row in ids.items()}
    engine = EagerBatchEngine(model, rows=2, kv_dtype=KV, c_step=DecodeStep(model, KV))
    got = {name: [] for name in ids}
    rows = {}

    def join(name):
        rows[name] = engine.add(ids[name][:prompt[name]], 64)
        got[name].append(engine.prefill(rows[name]))

    def steps(n):
        for _ in range(n):
            names = [next(k for k, r in rows.items() if r is row) for row in engine.rows]  # in row order
            column = [ids[k][prompt[k] + len(got[k]) - 1] for k in names]
            logits = engine.step(torch.tensor(column))
            for i, k in enumerate(names):
                got[k].append(logits[i:i + 1])

    join("A"), join("B"), steps(6)  # A at 26 tokens, B at 14: 12 slots of padding before B
    join("C"), steps(6)             # C's 40 tokens pass the frontier (26): every row shifts right
    assert engine.cache.capacity == 4 and engine.c_step.cache is engine.cache  # grown, rebound
    engine.remove(rows.pop("A")), steps(4)  # C moves into A's row
    engine.remove(rows.pop("C")), steps(14)  # B alone, its padding still before it
    assert engine._waste() > 0 and engine.c_step.cache is engine.cache
    for name in ids:
        n = len(got[name])
        assert torch.equal(torch.cat(got[name]), want[name][:n]), name


@torch.no_grad()
def test_c_steps_rows_within_the_bound_of_torchs_batched_step(model):
    """The same engine without a C step (torch's batched step, its padding masked) on the same rows:
    within test_decode_step.py's bound (the C and the torch layers sum in other orders)."""
    long_ids, short_ids = _ids(model, 60, 1), _ids(model, 40, 2)
    runs = []
    for c_step in (None, DecodeStep(model, KV)):
        engine = EagerBatchEngine(model, rows=2, kv_dtype=KV, c_step=c_step)
        rows = [engine.add(long_ids[:30], 30), engine.add(short_ids[:10], 30)]
        for r in rows:
            engine.prefill(r)
        runs.append(torch.cat(_steps(engine, [long_ids[30:50], short_ids[10:30]])))
    want, got = runs
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    print(f"rows together: max |difference| {err:.3g} = {err / scale:.2e} of the logits' scale")
    assert 0 < err <= BOUND * scale, (err / scale, BOUND)  # 0: both ran the same code


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
    assert plan.c_step and "a server decodes with the batch engine (its steps in C)" in plan.describe()
    served = load_served(str(path), engine="eager", parallel=2)
    try:
        assert isinstance(served.worker.engine.c_step, DecodeStep)
    finally:
        served.worker.close()
