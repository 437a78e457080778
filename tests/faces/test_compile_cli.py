"""`llamablock compile` and `generate --engine auto`: the compiled engine is used by default once it
is built for the model file and format, the eager model (with a line saying how to build it)
before that, and again when the build's packages are gone. Tokens equal the eager ones (greedy)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from batch_driver import assert_each_alone, batched
from gguf_tiny import count_calls, write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli
from llamablock.fast.compiled import builds
from llamablock.fast.compiled.batch_compiled import CompiledBatchEngine
from llamablock.web.generation import load_served

# A command resolves --model once, parses a GGUF's header once and reads its weights once.
ONE_EACH = {"resolve_model": 1, "open_gguf": 1, "gguf_tensors": 1}


def _count_reads(monkeypatch) -> dict:
    import llamablock.fast.kernels.native  # noqa: F401  (imported, so that its names are counted too)
    import llamablock.fast.plan  # noqa: F401

    return {name: count_calls(monkeypatch, name) for name in ONE_EACH}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    f = tmp_path_factory.mktemp("compile") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64))
    return f


def _generate(capsys, tiny, *more):
    assert cli.main(["generate", "--model", str(tiny), "--prompt", "abc def", "--json", *more]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_auto_uses_the_compiled_engine_once_it_is_built(capsys, tiny, monkeypatch):
    torch._dynamo.reset()
    before = _generate(capsys, tiny, "--max-new-tokens", "8")
    assert before["weights"] == "the file's own precision: 21 tensors float32"  # eager: nothing built yet
    with monkeypatch.context() as m:
        counts = _count_reads(m)
        assert cli.main(["compile", "--model", str(tiny), "--tokens", "64", "--no-autotune"]) == 0
        assert {k: len(v) for k, v in counts.items()} == ONE_EACH, counts  # one way in (fast/plan.py)
    out = capsys.readouterr().out
    assert "the decode step" in out and "done:" in out and builds.built_length(tiny, "float32") == 64
    with monkeypatch.context() as m:
        counts = _count_reads(m)
        after = _generate(capsys, tiny, "--max-new-tokens", "8")
        assert {k: len(v) for k, v in counts.items()} == ONE_EACH, counts
    assert after["weights"] == "float32, compiled" and after["tokens"] == before["tokens"]
    with monkeypatch.context() as m:  # a server with the compiled engine: its eager model from the same read
        counts = _count_reads(m)
        served = load_served(str(tiny), max_queue=1, compile_tokens=64, parallel=1)
        served.worker.close()
        assert {k: len(v) for k, v in counts.items()} == ONE_EACH, counts
    assert served.worker.compiled is not None and served.worker.compiled.running.get("step") != "eager"
    # Without --max-new-tokens the compiled engine stops where its cache ends (64 slots): no new build.
    bounded = _generate(capsys, tiny)
    assert bounded["weights"] == "float32, compiled" and bounded["prompt_tokens"] + bounded["new_tokens"] <= 64
    assert _generate(capsys, tiny, "--engine", "eager", "--max-new-tokens", "8")["weights"].startswith("the file's")
    for package in json.loads(Path(builds._index_file()).read_text())[builds._key(tiny, "float32")]["lengths"]["64"]:
        shutil.rmtree(package)  # pruned or cleared: auto falls back to eager
    assert builds.built_length(tiny, "float32") is None
    assert _generate(capsys, tiny, "--max-new-tokens", "8")["weights"].startswith("the file's")


def test_the_eager_summary_says_how_to_build_the_compiled_engine(capsys, tmp_path):
    f = tmp_path / "fresh.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64))
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc", "--max-new-tokens", "2"]) == 0
    assert f"eager engine: `llamablock compile --model {f}` builds the compiled one" in capsys.readouterr().err


def test_compile_refuses_more_tokens_than_the_context(capsys, tiny):
    assert cli.main(["compile", "--model", str(tiny), "--tokens", "65"]) == 2
    assert "exceeds the model's context of 64" in capsys.readouterr().err


def test_a_build_by_other_code_is_not_used_and_the_summary_says_to_rebuild(capsys, tmp_path, monkeypatch):
    """After an upgrade or an edit of llamablock (or another torch), the packages of an earlier build
    no longer match the code; auto must run eager and say so, not compile for minutes in the foreground."""
    f = tmp_path / "built.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64))
    package = tmp_path / "package"
    package.mkdir()  # a package directory on disk, as a real build leaves
    with monkeypatch.context() as m:
        m.setattr(builds, "_code", lambda: "torch 0.0 llamablock earlier")
        builds.record(f, "float32", 64, [package], 1.0)
        assert builds.built_length(f, "float32") == 64 and builds.any_build(f)
    assert builds.built_length(f, "float32") is None and not builds.any_build(f) and builds.stale_build(f)
    assert builds.last_build_seconds(f, "float32") == 1.0  # for the rebuild's progress line
    out = _generate(capsys, f, "--max-new-tokens", "2")
    assert out["weights"].startswith("the file's own precision")  # eager
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc", "--max-new-tokens", "2"]) == 0
    assert "the compiled one was built by another llamablock or torch" in capsys.readouterr().err
    builds.record(f, "float32", 64, [package], 2.0)  # the rebuild replaces the other code's entry
    assert builds.built_length(f, "float32") == 64 and not builds.stale_build(f)
    assert [k for k in json.loads(builds._index_file().read_text()) if k.startswith(builds._file(f))] == [
        builds._key(f, "float32")]


# (prompt length, new tokens, arrival step): five requests through three compiled rows
BATCH_REQUESTS = [(7, 20, 0), (3, 12, 0), (30, 10, 2), (12, 25, 4), (5, 40, 6)]


@pytest.mark.slow
def test_compile_batch_builds_the_servers_step_and_its_rows_equal_each_request_alone(capsys, tiny, monkeypatch):
    """`compile --batch 3` builds the step for three sequences and for one; `serve --parallel 3` then
    decodes its rows with those programs (the file read once), and each request's greedy tokens and logits equal
    its run alone on the eager model (1e-4 of the largest logit: inductor's kernels against eager
    float32, as tests/fast/compiled/test_compiled_decode.py allows)."""
    torch._dynamo.reset()
    assert cli.main(["compile", "--model", str(tiny), "--tokens", "64", "--batch", "3", "--no-autotune"]) == 0
    out = capsys.readouterr().out
    assert "--parallel 3` now uses it" in out
    assert builds.built_length(tiny, "float32", batch=3) == 64 and builds.built_length(tiny, "float32", batch=2) is None
    with monkeypatch.context() as m:
        counts = _count_reads(m)
        served = load_served(str(tiny), max_queue=1, parallel=3)
        served.worker.close()
        assert {k: len(v) for k, v in counts.items()} == ONE_EACH, counts
    engine = served.worker.engine
    assert isinstance(engine, CompiledBatchEngine) and engine.compiled.buckets == (1, 3)
    assert set(engine.compiled.running) == {"step", "step x1"} and "eager" not in engine.compiled.running.values()
    assert "the compiled steps for 1 and 3 rows" in served.worker.describe()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, served.model.cfg.vocab_size, (n,), generator=g).tolist() for n, _, _ in BATCH_REQUESTS]
    assert_each_alone(batched(engine, prompts, BATCH_REQUESTS), served.model, prompts, BATCH_REQUESTS, 1e-4)
