"""`llamablock perplexity`: a model's perplexity on a text file, with a sliding window.

Windows of `context` tokens advance by `stride` (llamablock.runtime.evaluate.sliding_perplexity,
the strided evaluation of transformers' perplexity guide).
    perplexity = exp(total negative log-likelihood / tokens scored)

The text is read within bounds (llamablock.util.reads): a FIFO or a directory is refused by what
it is, a whole file at most MAX_TEXT bytes, and with --max-tokens N only as much of it as N tokens
need (`prefix_ids`), instead of tokenizing the whole file first (its memory grows with the file).
"""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

from llamablock.fast.formats import CHOICES
from llamablock.io.scaling_flags import add_scaling_arguments, check_flags
from llamablock.runtime.evaluate import compare_to_reference, sliding_perplexity
from llamablock.util.devices import DEVICES
from llamablock.util.reads import read_text_bounded, regular_file

MAX_TEXT = 16 << 20  # bytes of text scored whole: past this, --max-tokens says how much to read
FIRST_CHUNK = 16 << 10  # bytes read first for --max-tokens; each further read doubles what is held


def add_arguments(p) -> None:
    p.add_argument("file", metavar="FILE", help="a UTF-8 text file")
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="a .gguf file, a transformers directory or an embedded model name (default: smollm2-135m-instruct)")
    p.add_argument("--context", type=int, default=512,
                   help="tokens per window; past the model's trained context with --rope-scaling (default: "
                        "%(default)s)")
    p.add_argument("--stride", type=int, default=None, help="tokens the window advances (default: context / 2)")
    p.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens of the file")
    p.add_argument("--dtype", choices=CHOICES, default="auto",
                   help="weights and activations; auto: the file's own precision (as generate); blocks: the "
                        "file's own blocks; q8/q4: int8/int4 weights, bfloat16 activations "
                        "(default: %(default)s)")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where the model runs (default: auto, the best available: cuda, then mps, then cpu); "
                        "the packed q8/q4 formats and the compiled engine run on the CPU")
    p.add_argument("--compare", choices=[c for c in CHOICES if c != "auto"], default=None, metavar="FORMAT",
                   help="also run the model in FORMAT (float32: the file's exact dequantization) on the same "
                        "windows and report --dtype's perplexity ratio, mean KL divergence and top-1 agreement "
                        "against it, as llama.cpp's --kl-divergence (CPU only)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_scaling_arguments(p)


def prefix_ids(path: Path, tok, max_tokens: int) -> list[int]:
    """The first `max_tokens` token ids of the UTF-8 file `path`, reading it in doubling chunks:
    as much as they need, not the whole file. A prefix is accepted once two successive readings
    (the second twice as long) agree on their first `max_tokens` ids, so that a word cut at the end
    of a reading cannot change them; or at the end of the file."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    text, previous, want = "", None, FIRST_CHUNK
    with open(regular_file(path, "text file"), "rb") as f:
        while True:
            data = f.read(want)
            try:
                text += decoder.decode(data, final=not data)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path} is not UTF-8 text: {e}") from None
            if not data and not text.strip():
                raise ValueError(f"{path} is empty")
            ids = tok.encode(text)[:max_tokens]
            if not data or (len(ids) == max_tokens and ids == previous):
                return ids
            previous, want = ids, max(want, len(text))


def run(args) -> int:
    check_flags(args)  # before the text or the model is read
    path = regular_file(args.file, "text file")  # a FIFO hung the read; a directory said "not found"
    if args.max_tokens is not None and args.max_tokens < 2:
        raise ValueError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is empty")
    if args.max_tokens is None:
        if os.path.getsize(path) > MAX_TEXT:
            raise ValueError(f"{path} has {os.path.getsize(path):,} bytes, more than the {MAX_TEXT:,} scored whole; "
                             "give --max-tokens N to score its first N tokens")
        text = read_text_bounded(path, MAX_TEXT, "text file")
        if not text.strip():
            raise ValueError(f"{path} is empty")
    if args.stride is not None and args.stride < 1:
        raise ValueError(f"--stride must be at least 1, got {args.stride}")
    stride = args.stride or max(1, args.context // 2)
    from llamablock.fast.plan import build, decide
    from llamablock.io.scaling_flags import scaled_source
    from llamablock.io.source import open_source
    from llamablock.util.devices import resolve_device

    device = resolve_device(args.device)
    if args.compare and device != "cpu":
        raise ValueError(f"--compare runs both models on the CPU (the packed formats' kernels); use --device cpu, "
                         f"not {device}")
    source = scaled_source(open_source(args.model), args, window=args.context)  # the flags' context and RoPE
    running = build(source, decide(source, args.dtype, "eager", device))
    model, tok, what = running.model, source.tokenizer, running.engine.describe()
    ids = tok.encode(text) if args.max_tokens is None else prefix_ids(path, tok, args.max_tokens)
    if args.compare:
        reference = build(source, decide(source, args.compare, "eager", device)).model
        r = compare_to_reference(model, reference, ids, args.context, stride, progress=not args.json)
        r.update(context=args.context, stride=stride, weights=what, reference=args.compare)
        print(json.dumps(r) if args.json else
              f"perplexity {r['perplexity']:.4f} ({what}) against {r['reference_perplexity']:.4f} ({args.compare}): "
              f"ratio {r['perplexity_ratio']:.5f}, mean KL {r['mean_kl']:.6f} nats, top-1 agreement "
              f"{100 * r['top1_agreement']:.2f}% over {r['tokens_scored']} tokens (context {args.context}, stride {stride})")
        return 0
    ppl, scored = sliding_perplexity(model, ids, args.context, stride, progress=not args.json)
    scaling = (source.cfg.rope_scaling or {}).get("rope_type")
    if args.json:
        print(json.dumps({"perplexity": ppl, "tokens_scored": scored, "context": args.context, "stride": stride,
                          "rope_scaling": source.cfg.rope_scaling}))
    else:
        print(f"perplexity {ppl:.3f} over {scored} tokens (context {args.context}, stride {stride}"
              f"{f', RoPE scaling {scaling}' if scaling else ''})")
    return 0
