"""`llamablock perplexity`: a model's perplexity on a text file, with a sliding window.

Windows of `context` tokens advance by `stride` (llamablock.runtime.evaluate.sliding_perplexity,
the strided evaluation of transformers' perplexity guide).
    perplexity = exp(total negative log-likelihood / tokens scored)
"""

from __future__ import annotations

import json
from pathlib import Path

from llamablock.fast.native import CHOICES
from llamablock.runtime.evaluate import sliding_perplexity
from llamablock.util.devices import DEVICES


def add_arguments(p) -> None:
    p.add_argument("file", metavar="FILE", help="a UTF-8 text file")
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="a .gguf file, a transformers directory or an embedded model name (default: smollm2-135m-instruct)")
    p.add_argument("--context", type=int, default=512, help="tokens per window (default: %(default)s)")
    p.add_argument("--stride", type=int, default=None, help="tokens the window advances (default: context / 2)")
    p.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens of the file")
    p.add_argument("--dtype", choices=CHOICES, default="auto",
                   help="weights and activations; auto: the file's own precision (as generate); q8/q4: int8/int4 "
                        "weights, bfloat16 activations (default: %(default)s)")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where the model runs (default: auto, the best available: cuda, then mps, then cpu); "
                        "the packed q8/q4 formats and the compiled engine run on the CPU")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: {e}") from None
    if not text.strip():
        raise ValueError(f"{path} is empty")
    if args.stride is not None and args.stride < 1:
        raise ValueError(f"--stride must be at least 1, got {args.stride}")
    stride = args.stride or max(1, args.context // 2)
    from llamablock.fast.native import load_model
    from llamablock.util.devices import resolve_device

    model, tok, _ = load_model(args.model, args.dtype, resolve_device(args.device))
    ids = tok.encode(text)
    if args.max_tokens is not None:
        if args.max_tokens < 2:
            raise ValueError(f"--max-tokens must be at least 2, got {args.max_tokens}")
        ids = ids[: args.max_tokens]
    ppl, scored = sliding_perplexity(model, ids, args.context, stride, progress=not args.json)
    if args.json:
        print(json.dumps({"perplexity": ppl, "tokens_scored": scored, "context": args.context, "stride": stride}))
    else:
        print(f"perplexity {ppl:.3f} over {scored} tokens (context {args.context}, stride {stride})")
    return 0
