"""`llamablock.load` and `llamablock.generate`, the library's way in: the same plan, engine and tokens
as the command line (`llamablock generate --json`), and bad input refused in one clear error."""

from __future__ import annotations

import json

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

import llamablock
from llamablock import cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    f = tmp_path_factory.mktemp("face") / "tiny-q8.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16,
                                     max_position_embeddings=64), qtype="Q8_0")
    return str(f)


def test_load_and_generate_give_the_command_line_s_tokens(tiny, capsys):
    engine, tok = llamablock.load(tiny, engine="eager")
    g = llamablock.generate(engine, tok, "abc def", 6)
    assert cli.main(["generate", "--model", tiny, "--prompt", "abc def", "--max-new-tokens", "6", "--json",
                     "--engine", "eager", "--greedy"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert g.tokens == out["tokens"] and g.text == out["text"] and engine.describe() == out["weights"]
    assert engine.plan.engine == "eager" and engine.plan.formats["Q8_0"] in ("blocks", "q8")


def test_load_follows_the_format_asked_for(tiny):
    engine, _ = llamablock.load(tiny, fmt="q8", engine="eager")
    assert set(engine.plan.formats.values()) == {"q8"} and engine.describe() == "q8"


def test_load_refuses_bad_input_by_name(tiny, tmp_path):
    with pytest.raises(ValueError, match="--dtype must be one of"):
        llamablock.load(tiny, fmt="int3")
    with pytest.raises((FileNotFoundError, ValueError), match="nothing.gguf"):
        llamablock.load(str(tmp_path / "nothing.gguf"))
