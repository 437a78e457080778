"""Regression tests for generation and evaluation flags that ended in tracebacks or were silently
accepted: each is now refused with one line and exit status 2 (or, for a tiny temperature,
answered correctly), before the model loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    f = tmp_path_factory.mktemp("flags") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64))
    return str(f)


@pytest.mark.parametrize("flags,message", [
    (["--stop", ""], "--stop is empty"),
    (["--temperature", "nan"], "temperature must be a finite number"),
    (["--repetition-penalty", "nan"], "repetition_penalty must be a finite number"),
    (["--top-p", "inf"], "top_p must be a finite number"),
    (["--seed", str(2**64)], "--seed must be between -2**63 and 2**64 - 1"),  # was "Overflow when unpacking long long"
])
def test_bad_generation_flags_are_one_line(capsys, tiny, flags, message):
    assert cli.main(["generate", "--model", tiny, "--prompt", "abc", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


EXTEND = "extend it with --rope-scaling linear|ntk|dynamic|dynamic-consistent|yarn|llama3"


@pytest.mark.parametrize("flags,message", [  # the tiny model's trained context is 64 tokens
    (["--ctx-size", "128"], f"--ctx-size 128 exceeds the model's trained context of 64 tokens; {EXTEND}"),
    (["--rope-scaling", "none", "--ctx-size", "128"], EXTEND),
    (["--rope-scaling", "rope"], "--rope-scaling 'rope' is unknown; choose one of none, linear, ntk, dynamic, dynamic-consistent, yarn"),
    (["--rope-scaling", "linear", "--rope-scale", "0.5"], "--rope-scale must be at least 1, got 0.5"),
    (["--rope-scaling", "yarn", "--ctx-size", "32"], "would be a factor of 0.5, below 1"),
    (["--rope-scale", "2"], "--rope-scale applies to --rope-scaling linear|ntk|dynamic|dynamic-consistent|yarn|llama3, "
                            "and none is given"),
    (["--yarn-beta-fast", "8"], "--yarn-beta-fast applies to --rope-scaling yarn, and none is given"),
    (["--rope-scaling", "llama3", "--yarn-attn-factor", "2"], "--yarn-attn-factor applies to --rope-scaling yarn, not"),
    (["--rope-scaling", "linear", "--yarn-orig-ctx", "32"], "--yarn-orig-ctx applies to --rope-scaling yarn|llama3"),
    (["--rope-scaling", "yarn", "--yarn-orig-ctx", "0"], "--yarn-orig-ctx must be a positive number of tokens"),
    (["--rope-scaling", "yarn", "--yarn-beta-fast", "1", "--yarn-beta-slow", "4"],
     "--yarn-beta-fast (1.0) must be >= --yarn-beta-slow (4.0)"),
    (["--rope-scaling", "yarn", "--yarn-attn-factor", "0"], "--yarn-attn-factor must be a positive number"),
    (["--rope-freq-base", "-5"], "--rope-freq-base must be a positive number"),
    (["--ctx-size", "1"], "--ctx-size must be at least 2 tokens"),
    (["--rope-scaling", "dynamic", "--ctx-size", "32"], "would be a factor of 0.5, below 1"),
    (["--ctx-size", "128", "--rope-scaling", "dynamic", "--engine", "compiled"],
     "--rope-scaling dynamic changes RoPE's frequencies with the length"),
    (["--ctx-size", "128", "--rope-scaling", "dynamic-consistent", "--compile"], "run it with --engine eager"),
])
def test_bad_scaling_flags_are_one_line(capsys, tiny, flags, message):
    assert cli.main(["generate", "--model", tiny, "--prompt", "abc", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("command", ["generate", "perplexity", "serve", "compile"])
def test_a_context_whose_cache_cannot_fit_is_refused_in_one_line(capsys, tiny, tmp_path, monkeypatch, command):
    """The KV cache at --ctx-size (the calculator's bytes, in 16 bits) against the memory the machine
    has available, before anything is sized for it: here a machine with 1 MiB left."""
    from llamablock.util import units

    monkeypatch.setattr(units, "available_memory", lambda: 2**20)
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 30)
    args = {"generate": ["--prompt", "abc"], "perplexity": [str(text)], "serve": [], "compile": []}[command]
    flags = ["--ctx-size", "100000", "--rope-scaling", "yarn"]
    assert cli.main([command, "--model", tiny, *args, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ctx-size 100000 needs a KV cache of " in err, err
    assert "this machine has 1 MiB available; choose a smaller --ctx-size" in err, err
    monkeypatch.setattr(units, "available_memory", lambda: None)  # not known: nothing checked
    if command == "generate":
        assert cli.main([command, "--model", tiny, *args, "--max-new-tokens", "2", *flags]) == 0


def test_bad_scaling_flags_of_perplexity_and_serve_are_one_line(capsys, tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 30)
    assert cli.main(["perplexity", "--model", tiny, str(text), "--context", "128"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--context 128 exceeds the model's trained context of 64 tokens; {EXTEND}" in err
    assert cli.main(["perplexity", "--model", tiny, str(text), "--rope-scale", "2"]) == 2
    assert "--rope-scale applies to --rope-scaling" in capsys.readouterr().err
    assert cli.main(["serve", "--model", tiny, "--rope-scaling", "longrope"]) == 2  # before the port is bound
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rope-scaling 'longrope' is unknown" in err


def test_a_tiny_temperature_is_greedy_not_a_crash(capsys, tiny):
    argv = ["generate", "--model", tiny, "--prompt", "abc def", "--max-new-tokens", "6", "--json", "--seed", "0"]
    assert cli.main([*argv, "--temperature", "1e-40"]) == 0
    tiny_t = json.loads(capsys.readouterr().out)["tokens"]
    assert cli.main([*argv, "--greedy"]) == 0
    assert tiny_t == json.loads(capsys.readouterr().out)["tokens"]


def test_invalid_utf8_prompt_is_one_line(tiny):
    r = subprocess.run([sys.executable.encode(), b"-m", b"llamablock", b"generate", b"--model", tiny.encode(),
                        b"--prompt", b"\xff\xfe abc"], capture_output=True)
    assert r.returncode == 2 and b"Traceback" not in r.stderr and b"--prompt is not valid UTF-8" in r.stderr


def test_invalid_utf8_on_chat_stdin_is_one_line(tiny):
    r = subprocess.run([sys.executable, "-m", "llamablock", "generate", "--model", tiny, "--chat"],
                       input=b"\xff\xfe hello\n", capture_output=True)
    assert r.returncode == 2 and b"Traceback" not in r.stderr and b"not valid UTF-8" in r.stderr


def test_perplexity_stride_zero_is_refused(capsys, tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 10)
    assert cli.main(["perplexity", "--model", tiny, str(text), "--stride", "0"]) == 2
    assert "--stride must be at least 1, got 0" in capsys.readouterr().err


def test_a_training_seed_past_the_generators_range_is_one_line(capsys, tmp_path):
    """Batches are drawn with seed * 1_000_003 + step: a seed past 2**40 overflowed torch's
    generator ("Overflow when unpacking long long", naming no flag)."""
    argv = ["train", "--out", str(tmp_path / "run"), "--steps", "1", "--seed", str(2**70), "--no-progress"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed must be a whole number between -2**40 and 2**40" in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a torch without CUDA")
def test_train_device_cuda_without_cuda_is_one_line(capsys, tmp_path):
    """train refuses a device this torch lacks as generate and perplexity do (util.devices.resolve_device),
    before its folder is claimed; it used to fail in torch's CUDA initialisation with a traceback."""
    out = tmp_path / "run"
    assert cli.main(["train", "--arch", "2024", "--steps", "1", "--device", "cuda", "--out", str(out),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda: no CUDA device is available here" in err and not out.exists()
