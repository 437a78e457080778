"""`generate --context-overflow`, `--keep`, `--grp-attn-n/-w` from the command line: each policy
runs a tiny model past its context (the engines themselves are tested against references in
tests/runtime/test_overflow.py and tests/studies/test_grouped_cache.py), and every bad combination is one line,
exit status 2, before the model loads."""

from __future__ import annotations

import json

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    f = tmp_path_factory.mktemp("overflow") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=32))
    return str(f)


@pytest.mark.parametrize("flags,weights", [
    (["--context-overflow", "shift", "--keep", "2"], "context shift past 32 tokens, keeping the first 2"),
    (["--context-overflow", "sinks"], "attention sinks: 4 first tokens + the last 28"),
    (["--grp-attn-n", "4", "--grp-attn-w", "8", "--ctx-size", "96"], "Self-Extend: groups of 4 past a window of 8"),
])
def test_each_policy_generates_past_the_context(capsys, tiny, flags, weights):
    assert cli.main(["generate", "--model", tiny, "--prompt", "abc", "--max-new-tokens", "80", "--greedy", "--json",
                     *flags]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert weights in out["weights"]
    assert len(out["tokens"]) == 80 or out["stop_reason"] == "eos"  # a tiny random model may end a text
    assert 3 + len(out["tokens"]) > 32  # past the trained context of 32


def test_without_a_policy_the_same_request_is_refused(capsys, tiny):
    assert cli.main(["generate", "--model", tiny, "--prompt", "abc", "--max-new-tokens", "80"]) == 2
    assert "exceeds the model's context of 32 tokens" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--keep", "2"], "--keep applies to --context-overflow shift, not stop"),
    (["--grp-attn-w", "8"], "--grp-attn-w applies to Self-Extend: give --grp-attn-n too"),
    (["--grp-attn-n", "0"], "must be positive"),
    (["--grp-attn-n", "3", "--grp-attn-w", "8"], "must be a multiple of --grp-attn-n"),
    (["--grp-attn-n", "4", "--context-overflow", "sinks"], "choose one of Self-Extend"),
    (["--grp-attn-n", "4", "--rope-scaling", "yarn", "--ctx-size", "64"], "drop --rope-scaling"),
    (["--context-overflow", "sinks", "--rope-scaling", "linear", "--ctx-size", "64"], "sinks runs plain RoPE"),
    (["--context-overflow", "sinks", "--engine", "compiled"], "run on the eager engine"),
    (["--context-overflow", "shift", "--keep", "40"], "--keep must be between 0 and 30"),
    (["--grp-attn-n", "2", "--grp-attn-w", "8", "--ctx-size", "57"], "reaches 56 tokens"),
    (["--grp-attn-n", "4", "--grp-attn-w", "32"], "must be below the trained context of 32"),
])
def test_bad_combinations_are_one_line(capsys, tiny, flags, message):
    assert cli.main(["generate", "--model", tiny, "--prompt", "abc", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
