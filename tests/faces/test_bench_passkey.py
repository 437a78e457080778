"""`llamablock bench passkey` on a tiny GGUF model (trained context 256): the prompts reach past the
context through the generate command itself, rope eval's scoring of the same prompts with the
same scaling gives the same tokens, unscaled at 2L is refused, and the accuracy cells count the
answers that hold the key. Its accuracies mean nothing on random weights."""

from __future__ import annotations

import re

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from benchmarks import bench_passkey

YARN = "`generate --ctx-size 512 --rope-scaling yarn`"
UNSCALED = "`generate`, unscaled, in its own context (L)"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("passkey") / "tiny.gguf"
    write_tiny_gguf(path, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=256))
    return str(path)


def test_the_command_runs_past_the_context_as_rope_eval_scores_it(tiny):
    acc, each = bench_passkey.measure(tiny, keys=1, compare=("none", "yarn"))
    rows = {r[0]: r for r in acc.rows}
    assert list(rows) == [YARN, UNSCALED, "rope eval's scoring, none, float32", "rope eval's scoring, yarn, float32"]
    lengths = [int(x.replace(",", "")) for x in rows[YARN][1].split("-")]
    assert 256 < min(lengths) and max(lengths) <= 512 - 8  # past L, room for the 8 new tokens inside 2L
    assert int(rows[UNSCALED][1].replace(",", "").split("-")[-1]) <= 256 - 8
    assert all(len(r) == len(acc.headers) and r[-3].endswith(")") for r in acc.rows)  # every depth and "all" filled
    # The float32 file runs float32 in the command too: its tokens are rope eval's with the same yarn
    # (seen failing when the command's flags leave yarn out: plain RoPE past L answers otherwise).
    assert "yarn: the command's new tokens equal rope eval's scoring's on 3 of 3 prompts" in acc.notes[0]
    refused = [n for n in acc.notes if "(unscaled at 2L): refused, exit 2" in n]
    assert len(refused) == 2 and all("exceeds the model's trained context of 256" in n for n in refused)
    assert len(each.rows) == 3 and all(len(r) == 2 + len(rows) for r in each.rows)


def test_accuracy_counts_the_answers_that_hold_the_key(tiny, monkeypatch):
    from llamablock.io.source import open_source

    tok = open_source(tiny).tokenizer
    calls = []

    calls = []

    def fake(model, texts, flags, new):  # each row asks 2 keys at 10%, 50%, then 90%: the last two answered wrong
        said = []
        for text in texts:
            keys = re.findall(r"\d{5}", text)
            if not keys:  # the refusal checks' prompt
                said.append((2, "refused"))
                continue
            calls.append(keys[0])
            answer = keys[0] if len(calls) % 6 in (1, 2, 3, 4) else "12345"
            said.append((0, {"prompt_ids": tok.encode(text), "tokens": tok.encode(f" {answer}."), "weights": "fake"}))
        return said

    monkeypatch.setattr(bench_passkey, "generate", fake)
    acc, each = bench_passkey.measure(tiny, keys=2, compare=())
    assert [r[2:6] for r in acc.rows] == [["2/2", "2/2", "0/2", "4/6 (0.67)"]] * 2
    assert [r[2].split(":")[0] for r in each.rows] == ["right"] * 4 + ["wrong"] * 2
