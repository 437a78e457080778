"""Every read bounded: a FIFO given where a file is read hung for ever (opening one blocks
until a writer comes), /dev/zero exhausted memory, a directory or FIFO said "not found", and
`perplexity --max-tokens 100` tokenized a whole 30 MB file. Each path is now refused by what it is,
quickly, naming it; text is read only as far as it is needed.

Every call that could hang runs under `within`: on a daemon thread (opening a FIFO waits in the
kernel, without the GIL), failing the test after LIMIT_S and then opening the FIFO's other end so
that the thread can finish.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli
from llamablock.commands import perplexity
from llamablock.io.loading import load_model_and_tokenizer
from llamablock.io.tokenizer import sentencepiece_bpe
from llamablock.util.reads import read_text_bounded, regular_file

LIMIT_S = 20  # a refusal takes milliseconds; the hang it replaces lasted for ever


def _release(fifo: Path) -> None:
    """Open the FIFO's writing end (without waiting), so that a reader blocked on it returns."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def within(fn, *fifos: Path):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(LIMIT_S)
    if t.is_alive():
        for f in fifos:
            _release(f)
        t.join(5)
        pytest.fail(f"still waiting after {LIMIT_S} s (a read that blocks)")
    if "error" in out:
        raise out["error"]
    return out["value"]


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def cli_error(capsys, argv: list[str], *fifos: Path) -> str:
    """Run the command line; it must exit 2 with one line on stderr, which is returned."""
    code = within(lambda: cli.main(argv), *fifos)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, (code, err)
    return err


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    f = tmp_path_factory.mktemp("reads") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64))
    return f


# -- the helpers --------------------------------------------------------------------------------

def test_regular_file_says_what_a_path_is(tmp_path):
    with pytest.raises(ValueError, match=r"config file .*f is a FIFO \(named pipe\), not a regular file"):
        regular_file(fifo(tmp_path / "f"), "config file")
    with pytest.raises(ValueError, match="is a directory"):
        regular_file(tmp_path, "text file")
    with pytest.raises(ValueError, match="/dev/zero is a character device"):
        regular_file("/dev/zero", "config file")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(ValueError, match="is a socket"):
            regular_file(tmp_path / "sock")
    with pytest.raises(FileNotFoundError, match="text file not found"):
        regular_file(tmp_path / "none", "text file")


def test_read_text_bounded_refuses_a_file_past_its_limit(tmp_path):
    (tmp_path / "t").write_text("x" * 11)
    assert read_text_bounded(tmp_path / "t", 11) == "x" * 11
    with pytest.raises(ValueError, match="11 bytes, more than the 10 read"):
        read_text_bounded(tmp_path / "t", 10)


# -- FIFOs where files are read -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
def test_a_fifo_inside_a_model_directory_is_refused(tmp_path, name):
    d = tmp_path / "m"
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(d)
    (d / "tokenizer.json").write_text("{}")  # replaced below when it is the one tested
    (d / name).unlink(missing_ok=True)
    f = fifo(d / name)
    with pytest.raises(ValueError, match=f"{name} .*{name} is a FIFO"):
        within(lambda: load_model_and_tokenizer(d), f)


def test_a_fifo_as_model_is_refused_by_what_it_is(capsys, tmp_path):
    (tmp_path / "t.txt").write_text("hello world")
    f = fifo(tmp_path / "model.gguf")
    err = cli_error(capsys, ["perplexity", "--model", str(f), str(tmp_path / "t.txt")], f)
    assert str(f) in err and "FIFO" in err and "not found" not in err


def test_a_fifo_or_a_directory_as_perplexity_text_is_refused(capsys, tmp_path, tiny_gguf):
    f = fifo(tmp_path / "t.txt")
    err = cli_error(capsys, ["perplexity", "--model", str(tiny_gguf), str(f)], f)
    assert str(f) in err and "FIFO" in err
    err = cli_error(capsys, ["perplexity", "--model", str(tiny_gguf), str(tmp_path)])
    assert "is a directory" in err and "not found" not in err


@pytest.mark.parametrize("argv", [["rope", "--config"], ["rope", "lint"]])
def test_a_fifo_or_dev_zero_as_a_rope_config_is_refused(capsys, tmp_path, argv):
    f = fifo(tmp_path / "config.json")
    err = cli_error(capsys, [*argv, str(f)], f)
    assert str(f) in err and "FIFO" in err
    err = cli_error(capsys, [*argv, "/dev/zero"])  # was a MemoryError
    assert "/dev/zero is a character device" in err


def test_a_fifo_gguf_as_rope_lint_target_is_refused(capsys, tmp_path):
    f = fifo(tmp_path / "m.gguf")
    assert "FIFO" in cli_error(capsys, ["rope", "lint", str(f)], f)


# -- reading only what is needed ------------------------------------------------------------------

def test_perplexity_max_tokens_reads_only_a_prefix(tmp_path, tiny_gguf):
    """The file ends in a byte that is not UTF-8: reading it whole would refuse it. With
    --max-tokens the prefix read gives the same ids as tokenizing the whole valid text."""
    _, tok = load_model_and_tokenizer(tiny_gguf)
    words = "the quick brown fox jumps over the lazy dog\n" * 50_000  # 2.2 MB
    (tmp_path / "t.txt").write_bytes(words.encode() + b"\xff")
    ids = within(lambda: perplexity.prefix_ids(tmp_path / "t.txt", tok, 100))
    assert ids == tok.encode(words)[:100]
    with pytest.raises(ValueError, match="not UTF-8"):  # past the prefix, the whole file is read
        perplexity.prefix_ids(tmp_path / "t.txt", tok, 10**9)


def test_perplexity_without_max_tokens_refuses_a_text_past_max_text(capsys, tmp_path, tiny_gguf, monkeypatch):
    monkeypatch.setattr(perplexity, "MAX_TEXT", 1000)
    (tmp_path / "t.txt").write_text("word " * 400)
    err = cli_error(capsys, ["perplexity", "--model", str(tiny_gguf), str(tmp_path / "t.txt")])
    assert "2,000 bytes, more than the 1,000" in err and "--max-tokens" in err


# -- a vocabulary that would take for ever -------------------------------------------------------

def test_a_sentencepiece_token_of_a_million_characters_is_refused():
    """Rebuilding merges splits every token at every place: a 1,000,000-character token hung it."""
    tokens = ["<unk>", "a", "b", "ab", "a" * 1_000_000]
    with pytest.raises(ValueError, match=r"tokens\[4\] has 1,000,000 characters"):
        within(lambda: sentencepiece_bpe(tokens, [0.0] * len(tokens), None, 0))


def test_a_config_file_or_a_safetensors_index_that_is_a_fifo_is_refused(tmp_path):
    """config_from_file (every config.json reader) and a sharded checkpoint's index."""
    from llamablock.io.hf_config import config_from_file

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"config file .*config.json is a FIFO"):
        within(lambda: config_from_file(fifo), fifo)
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    os.mkfifo(tmp_path / "m" / "model.safetensors.index.json")
    with pytest.raises(ValueError, match=r"index.json .* is a FIFO"):
        within(lambda: load_model_and_tokenizer(tmp_path / "m"), tmp_path / "m" / "model.safetensors.index.json")
