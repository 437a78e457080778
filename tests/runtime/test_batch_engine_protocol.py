"""Every batch engine satisfies llamablock.runtime.engine.BatchEngine, what the server's scheduler runs.

The eager batch engine (llamablock.runtime.batch.EagerBatchEngine) and the compiled one
(llamablock.fast.compiled.batch_compiled.CompiledBatchEngine, over the static layout run eagerly:
the same interface, nothing compiled), the latter for a batch of B rows and for one row (`--parallel
1`): every member exists and takes the protocol's arguments (tests/conformance.py); each member
removed in turn fails the check. The scheduler's use of an engine reads nothing else (checked on
its source).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conformance import members, mismatches
from hf_reference import tiny_hf_model

import llamablock
from llamablock.fast.compiled.batch_compiled import CompiledBatchEngine
from llamablock.fast.compiled.static_engine import StaticEngine
from llamablock.runtime.batch import EagerBatchEngine
from llamablock.runtime.engine import BatchEngine

SCHEDULER = Path(__file__).resolve().parents[2] / "src" / "llamablock" / "web" / "scheduler.py"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(d)
    return llamablock.load_pretrained(d)


def _compiled(model, batch: int) -> CompiledBatchEngine:
    static = StaticEngine(model, batch=batch)
    static.prepare(64)
    return CompiledBatchEngine(model, static, chunk=16)


ENGINES = {
    "eager": lambda model: EagerBatchEngine(model, rows=2, chunk=16),
    "compiled, 3 rows": lambda model: _compiled(model, 3),
    "compiled, 1 row": lambda model: _compiled(model, 1),
}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_each_batch_engine_satisfies_the_protocol(tiny, name):
    engine = ENGINES[name](tiny)
    assert mismatches(engine, BatchEngine) == [] and isinstance(engine, BatchEngine)


@pytest.mark.parametrize("name", sorted(ENGINES))
@pytest.mark.parametrize("member", sorted(members(BatchEngine)))
def test_an_engine_without_a_member_fails_the_check(tiny, monkeypatch, name, member):
    engine = ENGINES[name](tiny)
    if member in vars(engine):
        delattr(engine, member)
    else:
        monkeypatch.delattr(type(engine), member)
    assert any(line.startswith(f"{member}:") for line in mismatches(engine, BatchEngine))


def test_a_method_with_another_signature_fails_the_check(tiny, monkeypatch):
    engine = ENGINES["eager"](tiny)
    monkeypatch.setattr(EagerBatchEngine, "add", lambda self, prompt_ids: None)
    assert [line.split(":")[0] for line in mismatches(engine, BatchEngine)] == ["add"]


def test_the_scheduler_reads_only_the_protocol_of_its_engine():
    used = {node.attr for node in ast.walk(ast.parse(SCHEDULER.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "engine" and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"}
    assert used and used <= set(members(BatchEngine)), used - set(members(BatchEngine))
