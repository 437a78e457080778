"""Perplexity past the trained context, llamablock beside llama.cpp's `llama-perplexity`, with the
same flags on the same file and text: the check that a scaling chosen here computes there.

One chunk of 2L tokens of Hamlet (SmolLM2-135M, L = 8,192), scored as llama-perplexity scores a
chunk: the second half only, each token predicted from everything before it in the chunk (its
file does not add a BOS token). llamablock reads the chunk in one pass of the model the flags make
(io/scaling_flags.py, as `generate`/`perplexity --ctx-size 16384 --rope-scaling METHOD` make it)
and averages the same tokens' losses; llama.cpp runs `llama-perplexity -m FILE -f TEXT -c 16384
--chunks 1 --rope-scaling METHOD --rope-scale 2` (and `--yarn-orig-ctx 8192` for YaRN) where a
hand-built binary is found ($LLAMA_CPP_BIN, else the PATH; never installed by the project).
--quick: llamablock only, a chunk of 1,024 tokens with the context taken as 512.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from benchmarks.common import Section, llama_cpp_tool, verdict

NAME = "scaled_perplexity"
CLAIM = ("past the trained context, llamablock's perplexity with --rope-scaling linear or yarn at 2x equals "
         "llama.cpp's llama-perplexity with the same flags on the same file and text within 0.5%")
METHODS = ("yarn", "linear")


def _ours(own, ids: list[int], method: str, n: int, original: int) -> float:
    from llamablock.fast.plan import build, decide
    from llamablock.io.scaling_flags import add_scaling_arguments, scaled_source
    from llamablock.runtime.evaluate import token_losses

    p = argparse.ArgumentParser()
    add_scaling_arguments(p)
    base = own if original == own.cfg.max_seq_len else dataclasses.replace(own, cfg=own.cfg.replace(max_seq_len=original))
    source = scaled_source(base, p.parse_args(["--ctx-size", str(n), "--rope-scaling", method, "--rope-scale", "2"]))
    built = build(source, decide(source, "auto", "eager", rescaled=True))
    with torch.no_grad():
        losses = token_losses(built.model, torch.tensor([ids[:n]]))  # losses[i]: token i + 1 from 0..i
    return math.exp(float(losses[n // 2:].mean()))  # positions n/2 .. n-2, as llama-perplexity scores a chunk


def _theirs(binary: str, gguf: str, text: Path, method: str, n: int, original: int) -> float:
    flags = ["--rope-scaling", method, "--rope-scale", "2"] + (["--yarn-orig-ctx", str(original)] if method == "yarn" else [])
    out = subprocess.run([binary, "-m", gguf, "-f", str(text), "-c", str(n), "--chunks", "1", "-t",
                          str(torch.get_num_threads()), "-b", "2048", *flags], capture_output=True, text=True)
    found = re.findall(r"\[1\]([\d.]+)", out.stdout + out.stderr)
    if not found:
        raise RuntimeError(f"llama-perplexity gave no perplexity: {(out.stdout + out.stderr)[-800:]}")
    return float(found[-1])


def run(quick: bool = False) -> list[Section]:
    from llamablock.io.resolve import resolve_model
    from llamablock.io.source import open_source
    from llamablock.training.data import list_plays, play_to_text

    own = open_source(None)
    original = 512 if quick else own.cfg.max_seq_len
    n = 2 * original
    text = play_to_text(next(p for p in list_plays("all") if p.stem == "hamlet").read_text(encoding="utf-8"))
    ids = own.tokenizer.encode(text)
    binary = None if quick else llama_cpp_tool("llama-perplexity")
    sec = Section(f"SmolLM2-135M-Instruct, one chunk of {n:,} tokens of Hamlet (2x a context of {original:,}), the "
                  f"second half scored, {torch.get_num_threads()} thread(s)",
                  ["--rope-scaling (x2)", "llamablock", "llama-perplexity", "ratio"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hamlet.txt"
        path.write_text(text, encoding="utf-8")
        for method in METHODS:
            ours = _ours(own, ids, method, n, original)
            theirs = _theirs(binary, str(resolve_model(None)), path, method, n, original) if binary else None
            sec.rows.append([method, f"{ours:.3f}", f"{theirs:.3f}" if theirs else "",
                             f"{ours / theirs:.4f}" if theirs else ""])
            if theirs:
                sec.notes.append(verdict(f"{method}: |1 - ratio|", abs(1 - ours / theirs), 0.005,
                                         higher_is_better=False, unit=""))
    if binary is None:
        sec.notes.append("llama.cpp: no llama-perplexity found ($LLAMA_CPP_BIN or the PATH)" +
                         (" (--quick runs llamablock only)" if quick else "") + ": its column is empty.")
    return [sec]
