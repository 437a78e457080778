"""`llamablock generate` and `llamablock perplexity`: output, JSON, and one-line errors (exit 2).

Most cases run `cli.main` in-process on a tiny GGUF written with gguf's writer; two run the
installed command in a subprocess on the real SmolLM2 file (the issue's "done when" line, and a
truncated file), to see exactly what a user sees: no traceback.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli
from llamablock.io.loading import load_model_and_tokenizer
from llamablock.io.resolve import resolve_model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    f = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64))
    return str(f)


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_streams_and_summarizes(capsys, tiny_gguf):
    code, out, err = _run(capsys, "generate", "--model", tiny_gguf, "--prompt", "abc def", "--max-new-tokens", "5")
    assert code == 0 and out.strip()
    assert "7 prompt tokens, 5 new tokens" in err and "decode" in err  # a b c space d e f


def test_generate_verbose_prints_the_plan_first(capsys, tiny_gguf):
    """The plan, before anything else, names the CPU, its kind and the block kernel's build."""
    from llamablock.fast.kernels.ggml_kernel import best_isa
    from llamablock.util.cpu import this_cpu

    code, _, err = _run(capsys, "generate", "--model", tiny_gguf, "--prompt", "abc", "--max-new-tokens", "2", "--verbose")
    assert code == 0 and err.startswith("plan: eager engine on cpu")
    assert f"machine: {this_cpu().describe()}; kind {this_cpu().kind}; block kernel: its {best_isa()} build" in err


def test_generate_json(capsys, tiny_gguf):
    code, out, _ = _run(capsys, "generate", "--model", tiny_gguf, "--prompt", "abc", "--max-new-tokens", "6",
                        "--temperature", "0.8", "--top-k", "10", "--top-p", "0.9", "--seed", "3", "--json")
    d = json.loads(out)
    assert code == 0 and d["prompt_ids"] == [64, 65, 66] and len(d["tokens"]) == 6 and isinstance(d["text"], str)
    again = json.loads(_run(capsys, "generate", "--model", tiny_gguf, "--prompt", "abc", "--max-new-tokens", "6",
                            "--temperature", "0.8", "--top-k", "10", "--top-p", "0.9", "--seed", "3", "--json")[1])
    assert again["tokens"] == d["tokens"]


@pytest.mark.parametrize("dtype", ["float32", "q8"])
def test_generate_compile_gives_the_eager_tokens(capsys, tiny_gguf, dtype):
    argv = ("generate", "--model", tiny_gguf, "--prompt", "abc def", "--max-new-tokens", "12", "--dtype", dtype, "--json")
    eager = json.loads(_run(capsys, *argv)[1])
    torch._dynamo.reset()
    code, out, err = _run(capsys, *argv, "--compile")
    assert code == 0 and "the compiled decode step" in err
    assert json.loads(out)["tokens"] == eager["tokens"]


@pytest.mark.parametrize("argv,message", [
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "abc", "--max-new-tokens", "0"], "--max-new-tokens must be a positive integer, got 0"),
    (["--prompt", "abc", "--max-new-tokens", "-4"], "--max-new-tokens must be a positive integer, got -4"),
    (["--prompt", "a" * 80], "exceeds the model's context of 64 tokens"),
    (["--prompt", "abc", "--temperature", "-1"], "temperature must be >= 0"),
    (["--prompt", "abc", "--greedy", "--top-k", "-5"], "top_k must be >= 0"),  # ignored by --greedy, still checked
    (["--prompt", "abc", "--greedy", "--top-p", "2"], "top_p must be in (0, 1]"),
    ([], "give --prompt TEXT, or --chat"),
    (["--prompt", "abc", "--chat"], "no chat template"),
])
def test_generate_bad_input_is_one_line(capsys, tiny_gguf, argv, message):
    code, out, err = _run(capsys, "generate", "--model", tiny_gguf, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("llamablock generate: error:") and message in err


def test_bad_files_are_one_line(capsys, tmp_path, tiny_gguf):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    arch = tmp_path / "mamba.gguf"
    write_tiny_gguf(arch, tiny_hf_model("llama", n_heads=4, n_kv=2), arch="mamba")
    quant = tmp_path / "q2k.gguf"
    big = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1, head_dim=64)
    q2k = np.zeros((256, 84), np.uint8)  # Q2_K: 84 bytes per 256 values (ggml-common.h)
    write_tiny_gguf(quant, tiny_hf_model("llama", n_heads=4, n_kv=2, **big), raw_blocks={"blk.0.attn_q.weight": (q2k, "Q2_K")})
    for f, message in [(junk, "is not a GGUF file"), (arch, "architecture 'mamba' is not supported"),
                       (quant, "quantization type Q2_K"), (tmp_path / "missing.gguf", "not found")]:
        code, out, err = _run(capsys, "generate", "--model", str(f), "--prompt", "abc")
        assert code == 2 and err.count("\n") == 1 and message in err, err


def test_perplexity_equals_direct_cross_entropy(capsys, tiny_gguf, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 3)
    model, tok = load_model_and_tokenizer(tiny_gguf)
    ids = tok.encode(text.read_text())[:60]
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, :-1]
    want = math.exp(F.cross_entropy(logits, torch.tensor(ids[1:])).item())
    code, out, _ = _run(capsys, "perplexity", "--model", tiny_gguf, str(text), "--context", "60", "--stride", "60",
                        "--max-tokens", "60", "--json")
    d = json.loads(out)
    assert code == 0 and d["tokens_scored"] == 59 and abs(d["perplexity"] - want) <= 1e-4 * want
    # Overlapping windows score every token once too, each with more history.
    d2 = json.loads(_run(capsys, "perplexity", "--model", tiny_gguf, str(text), "--context", "32", "--stride", "8",
                         "--max-tokens", "60", "--json")[1])
    assert d2["tokens_scored"] == 59 and math.isfinite(d2["perplexity"])


def test_perplexity_compare_against_the_files_float_reference(capsys, tiny_gguf, tmp_path):
    """--compare: the same format against itself is KL 0 with every top-1 equal; int8 weights
    against float32 (the file's exact weights) stray a little (KL > 0, ratio near 1)."""
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 3)
    argv = ("perplexity", "--model", tiny_gguf, str(text), "--context", "32", "--stride", "16", "--json",
            "--compare", "float32")
    same = json.loads(_run(capsys, *argv, "--dtype", "float32")[1])
    assert same["mean_kl"] == 0 and same["top1_agreement"] == 1 and same["perplexity_ratio"] == 1
    q8 = json.loads(_run(capsys, *argv, "--dtype", "q8")[1])
    assert q8["mean_kl"] > 0 and abs(q8["perplexity_ratio"] - 1) < 0.1 and q8["reference"] == "float32"
    assert q8["reference_perplexity"] == same["perplexity"] and q8["tokens_scored"] == same["tokens_scored"]


@pytest.mark.parametrize("argv,message", [
    (["--context", "1"], "--context must be in 2..64"),
    (["--context", "16", "--stride", "17"], "--stride must be in 1..16"),
])
def test_perplexity_bad_input(capsys, tiny_gguf, tmp_path, argv, message):
    text = tmp_path / "t.txt"
    text.write_text("hello world")
    code, _, err = _run(capsys, "perplexity", "--model", tiny_gguf, str(text), *argv)
    assert code == 2 and message in err
    code, _, err = _run(capsys, "perplexity", "--model", tiny_gguf, str(tmp_path / "none.txt"))
    assert code == 2 and "text file not found" in err


def _command(*argv):
    return subprocess.run([sys.executable, "-m", "llamablock", *argv], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_done_when_smollm2_continues_the_prompt():
    r = _command("generate", "--prompt", "The capital of France is", "--max-new-tokens", "20")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout  # SmolLM2-135M-Instruct greedy: " Paris." (transformers gives the same ids)
    assert "5 prompt tokens, 20 new tokens" in r.stderr and "prefill" in r.stderr


def test_truncated_default_size_file_subprocess(tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(resolve_model(None), "rb") as fh:
        cut.write_bytes(fh.read(5_000_000))
    r = _command("generate", "--model", str(cut), "--prompt", "hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "truncated" in r.stderr
