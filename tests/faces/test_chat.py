"""`llamablock generate --chat`: sampling defaults (the user's flags, else the model's generation
config, else Ollama's for a chat, greedy for a continuation), --system, multi-line messages, /clear
and /bye, a failing template as one line, and generation until end-of-sequence within the context."""

from __future__ import annotations

import io
import json

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli
from llamablock.io.loading import load_model_and_tokenizer
from llamablock.io.source import generation_config, open_source
from llamablock.runtime.sampling import CHAT_DEFAULTS, Sampling, sampling_for

# A template that shows every message with its role, as chat templates do.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
NONE = {"temperature": None, "top_k": None, "top_p": None, "repetition_penalty": None}


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory):
    f = tmp_path_factory.mktemp("chat") / "chat.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=256),
                    extra_kv={"tokenizer.chat_template": TEMPLATE})
    return str(f)


def _turns(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def _prompt_text(chat_gguf, turn: dict) -> str:
    _, tok = load_model_and_tokenizer(chat_gguf)
    return tok.decode(turn["prompt_ids"])


def test_sampling_precedence():
    assert sampling_for(NONE) == Sampling()  # a plain continuation: greedy
    assert sampling_for(NONE, chat=True) == Sampling(**CHAT_DEFAULTS)
    config = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}
    assert sampling_for(NONE, config, chat=True) == Sampling(0.6, 50, 0.9, 1.0)  # transformers' top_k 50 fills in
    assert sampling_for(NONE, {"do_sample": False, "temperature": 0.6}, chat=True) == Sampling()  # the file says greedy
    assert sampling_for({**NONE, "top_k": 5}, config) == Sampling(0.6, 5, 0.9, 1.0)  # a flag wins
    assert sampling_for({**NONE, "temperature": 0.9}, config, chat=True, greedy=True).temperature == 0.0


def test_generation_defaults_come_from_the_directory(tmp_path, chat_gguf):
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.3}))
    assert generation_config(tmp_path) == {"do_sample": True, "temperature": 0.3}
    assert open_source(chat_gguf).generation == {}  # a GGUF keeps no sampling settings


def test_system_message_reaches_the_template(capsys, chat_gguf):
    assert cli.main(["generate", "--model", chat_gguf, "--chat", "--system", "Be brief", "--prompt", "hi",
                     "--max-new-tokens", "2", "--json"]) == 0
    text = _prompt_text(chat_gguf, _turns(capsys)[0])
    assert text.startswith("<system>Be brief\n<user>hi\n<assistant>")


def test_chat_session_multiline_clear_and_bye(capsys, monkeypatch, chat_gguf):
    script = 'one\n\n"""\nline a\nline b\n"""\n/clear\nthree\n/bye\nnever read\n'
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    assert cli.main(["generate", "--model", chat_gguf, "--chat", "--greedy", "--max-new-tokens", "2", "--json"]) == 0
    prompts = [_prompt_text(chat_gguf, t) for t in _turns(capsys)]
    assert len(prompts) == 3  # the blank line is skipped, /bye ends before "never read"
    assert prompts[0] == "<user>one\n<assistant>"
    assert prompts[1].startswith("<user>one\n<assistant>") and prompts[1].endswith("<user>line a\nline b\n<assistant>")
    assert prompts[2] == "<user>three\n<assistant>"  # after /clear, the earlier turns are gone


def test_a_failing_template_is_one_line(capsys, tmp_path):
    f = tmp_path / "bad.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2),
                    extra_kv={"tokenizer.chat_template": "{{ raise_exception('system messages are not supported') }}"})
    assert cli.main(["generate", "--model", str(f), "--chat", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chat template failed" in err and "system messages are not supported" in err


def test_without_max_new_tokens_it_runs_to_the_end_of_the_context(capsys, tmp_path):
    """The tiny model rarely emits its end-of-sequence id: greedy, it fills the context exactly."""
    f = tmp_path / "short.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=48))
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc", "--json"]) == 0
    d = _turns(capsys)[0]
    assert d["prompt_tokens"] + d["new_tokens"] == 48 if d["stop_reason"] == "length" else d["new_tokens"] < 45
