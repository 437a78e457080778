"""`llamablock generate`: continue a prompt (or chat) with a real model, streaming the text.

Ends with one summary line on stderr: prompt tokens, new tokens, prefill and decode tokens/s
(decode = forward passes after the prefill, divided by their wall time). `--json` prints the
token ids and the text instead, as one JSON object. `--compile` decodes with
llamablock.fast.compiled_decode.AOTIEngine (AOTInductor packages, compiled once per model, format
and cache length, then loaded); its compile time is reported in the summary, never counted as
decode time.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from llamablock.commands import UsageError
from llamablock.fast.native import CHOICES


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="a .gguf file, a transformers directory or an embedded model name (default: smollm2-135m-instruct)")
    p.add_argument("--prompt", default=None, help="the text to continue (with --chat: the user's message)")
    p.add_argument("--chat", action="store_true",
                   help="apply the model's chat template; without --prompt, chat turn by turn on stdin")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens, 0 = all (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, 1 = off (default: %(default)s)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="CTRL penalty, 1 = off (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: none)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop when this text appears (repeatable)")
    p.add_argument("--dtype", choices=CHOICES, default="auto",
                   help="weights and activations; auto: the file's own precision (a GGUF's 8-bit tensors as q8, 4-bit "
                        "as q4, 5-6-bit as q8, F16/BF16 as bfloat16; a directory's torch_dtype); q8/q4: int8/int4 "
                        "weights, bfloat16 activations (default: %(default)s)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                   help="decode and prefill with the static layout compiled ahead of time (llamablock.fast.compiled_decode, "
                        "AOTInductor; BENCHMARKS.md compares its speed); compiling takes minutes once per model, format "
                        "and cache length, later runs load the compiled packages (default: eager)")
    p.add_argument("--json", action="store_true", help="print token ids and text as JSON instead of streaming")


def _summary(g, engine=None, weights: str | None = None) -> str:
    compiled = "" if engine is None else f", compiled decode ({engine.compile_seconds:.0f} s compiling)"
    runs = f", weights: {weights}" if weights else ""
    return (f"[{g.prompt_tokens} prompt tokens, {len(g.tokens)} new tokens, prefill {g.prefill_tokens_per_s:.1f} tok/s, "
            f"decode {g.decode_tokens_per_s:.1f} tok/s, stop: {g.stop_reason}{compiled}{runs}]")


def _one(model, tok, text: str, args, sampling, chat_history=None, engine=None):
    from llamablock.runtime.generate import generate

    if chat_history is not None:
        chat_history.append({"role": "user", "content": text})
        text = tok.apply_chat_template(chat_history)
    ids = tok.encode(text)
    if not args.json:
        # Validate before any output so an error is the only line printed.
        from llamablock.runtime.generate import check_request

        check_request(model, len(ids), args.max_new_tokens)
    on_text = None if args.json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    total = len(ids) + args.max_new_tokens
    if engine is not None and not engine.covers(total):
        from llamablock.fast.aoti_step import package_dir

        print(f"[the compiled decode step and prefill: loading them from {package_dir()}, or compiling them once "
              "(a few minutes; `llamablock cache` shows the disk they take)]",
              file=sys.stderr, flush=True)
        engine.prepare(total)
    g = generate(model if engine is None else engine, ids, args.max_new_tokens, sampling, seed=args.seed, eos_ids=tok.eos_ids,
                 stop_strings=args.stop, tokenizer=tok, on_text=on_text)
    if chat_history is not None:
        chat_history.append({"role": "assistant", "content": g.text})
    if args.json:
        print(json.dumps({"prompt_ids": ids, "tokens": g.tokens, "text": g.text, "stop_reason": g.stop_reason,
                          "weights": getattr(args, "weights", None),
                          "prompt_tokens": g.prompt_tokens, "new_tokens": len(g.tokens),
                          "prefill_tokens_per_s": g.prefill_tokens_per_s, "decode_tokens_per_s": g.decode_tokens_per_s},
                         ensure_ascii=False))
    else:
        print(flush=True)
        print(_summary(g, engine, getattr(args, "weights", None)), file=sys.stderr, flush=True)


@torch.no_grad()  # scoped, not torch.set_grad_enabled(False): callers in the same process keep autograd
def run(args) -> int:
    from llamablock.io.loading import load_model_and_tokenizer
    from llamablock.runtime.sampling import Sampling

    if args.prompt is None and not args.chat:
        raise UsageError("give --prompt TEXT, or --chat to talk turn by turn")
    if args.prompt is not None and not args.prompt.strip():
        raise UsageError("the prompt is empty: give some text to continue")
    if args.max_new_tokens <= 0:
        raise UsageError(f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}")
    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.repetition_penalty)
    engine = None
    if args.compile:  # the engine fuses the float weights, then quantizes them itself
        from llamablock.fast.compiled_decode import AOTIEngine
        from llamablock.fast.native import engine_format
        from llamablock.fast.quant import load_dtype

        fmt = engine_format(args.model, args.dtype)
        model, tok = load_model_and_tokenizer(args.model, load_dtype(fmt))
        engine, args.weights = AOTIEngine(model, fmt), f"{fmt}, compiled"
    else:
        from llamablock.fast.native import load_model

        model, tok, args.weights = load_model(args.model, args.dtype)
    if args.prompt is not None:
        _one(model, tok, args.prompt, args, sampling, [] if args.chat else None, engine)
        return 0
    history: list[dict] = []
    while True:  # interactive chat: one line per turn, an empty line or EOF ends it
        if sys.stdin.isatty():
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line.strip():
            return 0
        _one(model, tok, line.strip(), args, sampling, history, engine)
