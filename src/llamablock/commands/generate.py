"""`llamablock generate`: continue a prompt (or chat) with a real model, streaming the text.

Ends with one summary line on stderr: prompt tokens, new tokens, prefill and decode tokens/s
(decode = forward passes after the prefill, divided by their wall time). `--json` prints the
token ids and the text instead, as one JSON object. `--compile` decodes with
llamablock.fast.compiled.aoti_engine.AOTIEngine (AOTInductor packages, compiled once per model, format
and cache length, then loaded); its compile time is reported in the summary, never counted as
decode time.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from llamablock.commands import UsageError
from llamablock.commands.overflow_flags import add_overflow_arguments
from llamablock.fast.formats import CHOICES
from llamablock.io.scaling_flags import add_scaling_arguments
from llamablock.util.devices import DEVICES

COMPILED_NEW_TOKENS = 256  # --compile without --max-new-tokens: its cache length, and so its program, stays small
CHAT_HELP = 'chat: one message per line; """ on a line of its own starts and ends a message of many lines; /clear forgets the conversation; /bye (or end of input) ends'


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="a .gguf file, a transformers directory or a name from `llamablock models` "
                        "(default: smollm2-135m-instruct)")
    p.add_argument("--prompt", default=None, help="the text to continue (with --chat: the user's message)")
    p.add_argument("--chat", action="store_true",
                   help="apply the model's chat template; without --prompt, chat turn by turn on stdin (" + CHAT_HELP + ")")
    p.add_argument("--system", default=None, metavar="TEXT", help="with --chat: the system message")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens to generate at most (default: until end-of-sequence, bounded by the model's context; "
                        f"with --compile, {COMPILED_NEW_TOKENS})")
    p.add_argument("--temperature", type=float, default=None,
                   help="0 is greedy (default: the model's generation_config.json when it has one, else "
                        "0.8 for --chat, as Ollama, and 0 for a plain continuation)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens, 0 = all "
                   "(default: as --temperature; 40 for --chat)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, 1 = off (default: as --temperature; "
                   "0.9 for --chat)")
    p.add_argument("--repetition-penalty", type=float, default=None, help="CTRL penalty, 1 = off (default: as "
                   "--temperature; 1.1 for --chat)")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token (ignores the sampling flags)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: none)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop when this text appears (repeatable)")
    p.add_argument("--dtype", choices=CHOICES, default="auto",
                   help="weights and activations; auto: the file's own precision (a GGUF's Q4_0/Q4_1/Q5_0/Q8_0 and "
                        "K-quant blocks as stored, other 4-bit types as q4, 5-6-bit as q8, F16/BF16 as bfloat16; a "
                        "directory's torch_dtype); blocks: every layer matrix the file's own blocks, float32 "
                        "activations; q8/q4: int8/int4 "
                        "weights, bfloat16 activations (default: %(default)s)")
    p.add_argument("--kv-dtype", default="auto", metavar="{auto,float32,bfloat16,float16}",
                   help="the KV cache's dtype; auto: this CPU's 16-bit type (bfloat16 where it converts bfloat16 in "
                        "hardware, else float16) for quantized weights with float32 activations (the file's blocks), "
                        "else the activations' dtype; attention reads a 16-bit cache upcast to float32; --verbose "
                        "says which (default: %(default)s)")
    p.add_argument("--engine", choices=("auto", "eager", "compiled"), default="auto",
                   help="compiled: decode and prefill with the static layout compiled ahead of time "
                        "(llamablock.fast.compiled.static_engine, AOTInductor; BENCHMARKS.md compares its speed), compiling "
                        "once per model, format and cache length (minutes) if `llamablock compile` has not; eager: the "
                        "Decoder; auto: compiled when it is built for this model and format, else eager (default: auto)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="the same as --engine compiled (--no-compile: --engine eager)")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where the model runs (default: auto, the best available: cuda, then mps, then cpu); "
                        "the packed q8/q4 formats and the compiled engine run on the CPU")
    p.add_argument("--json", action="store_true", help="print token ids and text as JSON instead of streaming")
    p.add_argument("--verbose", action="store_true",
                   help="print the plan on stderr before loading: each stored type's format, the activations, the "
                        "block kernel's binding and layout, the engine, how a server would decode, the context and "
                        "RoPE scaling, and the machine facts they follow from (CPU features and kind, kernel build)")
    add_scaling_arguments(p)
    add_overflow_arguments(p)


def _summary(g, engine, plan) -> str:
    """The closing line: the run's counts and rates, and from the plan the engine and its note."""
    compiled = f", compiled decode ({engine.compile_seconds:.0f} s compiling)" if plan.engine == "compiled" else ""
    return (f"[{g.prompt_tokens} prompt tokens, {len(g.tokens)} new tokens, prefill {g.prefill_tokens_per_s:.1f} tok/s, "
            f"decode {g.decode_tokens_per_s:.1f} tok/s, stop: {g.stop_reason}{compiled}, weights: {engine.describe()}"
            f"{'; ' + plan.note if plan.note else ''}]")


def _budget(args, plan, n_prompt: int, context: int) -> int:
    """New tokens allowed: the flag, else the rest of the context; a compiled engine stops where its
    built cache ends (or at COMPILED_NEW_TOKENS), so that a default request never compiles again."""
    if args.max_new_tokens is not None:
        return args.max_new_tokens
    if args.context_overflow != "stop" or args.grp_attn_n is not None:
        return context  # past the context: one context's worth of new tokens unless told otherwise
    room = max(1, context - n_prompt)
    if plan.engine != "compiled":
        return room
    return max(1, min(room, plan.built - n_prompt)) if plan.built else min(room, COMPILED_NEW_TOKENS)


def _one(source, plan, engine, text: str, args, sampling, chat_history=None):
    from llamablock.fast.plan import prepare
    from llamablock.runtime.generate import check_request, generate

    tok = source.tokenizer
    if chat_history is not None:
        text = tok.apply_chat_template(chat_history + [{"role": "user", "content": text}])
    ids = tok.encode(text)
    new = _budget(args, plan, len(ids), source.cfg.max_seq_len)
    check_request(engine, len(ids), new)  # before any output, so that an error is the only line printed
    on_text = None if args.json else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    total = len(ids) + new
    if not engine.covers(total):
        from llamablock.fast.compiled.aoti_step import package_dir

        print(f"[the compiled decode step and prefill: loading them from {package_dir()}, or compiling them once "
              "(a few minutes; `llamablock cache` shows the disk they take)]",
              file=sys.stderr, flush=True)
        # at least the built length: a shorter request on a smaller cache would be another program,
        # compiled in the foreground although `llamablock compile` built one that holds it
        prepare(engine, source, max(total, plan.built or 0), plan.scaled)
    g = generate(engine, ids, new, sampling, seed=args.seed, eos_ids=tok.eos_ids, stop_strings=args.stop,
                 tokenizer=tok, on_text=on_text)
    if args.json:
        print(json.dumps({"prompt_ids": ids, "tokens": g.tokens, "text": g.text, "stop_reason": g.stop_reason,
                          "weights": engine.describe(),
                          "prompt_tokens": g.prompt_tokens, "new_tokens": len(g.tokens),
                          "prefill_tokens_per_s": g.prefill_tokens_per_s, "decode_tokens_per_s": g.decode_tokens_per_s},
                         ensure_ascii=False))
    else:
        print(flush=True)
        print(_summary(g, engine, plan), file=sys.stderr, flush=True)
    return g


def _check_text(flag: str, text: str | None) -> None:
    """Refuse text that is not valid UTF-8 (the shell passes undecodable bytes as lone surrogates)."""
    if text is not None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{flag} is not valid UTF-8 text; check the terminal's or the file's encoding") from None


def _messages(stream):
    """The user's messages on `stream`: one per line, or the lines between two lines of \"\"\";
    blank lines are skipped; /bye or the end of input ends, /clear is passed on."""
    while True:
        if stream.isatty():
            print("> ", end="", flush=True)
        try:
            line = stream.readline()
        except UnicodeDecodeError:
            raise UsageError("the chat input is not valid UTF-8 text; check the terminal's or the file's encoding") from None
        if not line:
            return
        _check_text("the chat input", line)
        text = line.strip()
        if text == '"""':
            lines = []
            for more in iter(stream.readline, ""):
                if more.strip() == '"""':
                    break
                lines.append(more.rstrip("\n"))
            text = "\n".join(lines).strip()
        if text == "/bye":
            return
        if text:
            yield text


@torch.no_grad()  # scoped, not torch.set_grad_enabled(False): callers in the same process keep autograd
def run(args) -> int:
    from llamablock.runtime.sampling import sampling_for

    if args.prompt is None and not args.chat:
        raise UsageError("give --prompt TEXT, or --chat to talk turn by turn")
    if args.prompt is not None and not args.prompt.strip():
        raise UsageError("the prompt is empty: give some text to continue")
    if args.max_new_tokens is not None and args.max_new_tokens <= 0:
        raise UsageError(f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}")
    if args.system is not None and not args.chat:
        raise UsageError("--system needs --chat: a plain continuation has no system message")
    if args.seed is not None and not -(2**63) <= args.seed < 2**64:  # what torch's generator takes
        raise UsageError(f"--seed must be between -2**63 and 2**64 - 1, got {args.seed}")
    if any(not s for s in args.stop):
        raise UsageError("--stop is empty: an empty stop string would stop before the first token; give some text")
    for flag, text in (("--prompt", args.prompt), ("--system", args.system), *(("--stop", s) for s in args.stop)):
        _check_text(flag, text)
    given = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
             "repetition_penalty": args.repetition_penalty}
    from llamablock.commands.overflow_flags import check_overflow_flags, eager_only, overflow_engine, self_extend_source
    from llamablock.fast.plan import build, decide
    from llamablock.io.scaling_flags import check_flags, scaled_source
    from llamablock.io.source import open_source
    from llamablock.util.devices import resolve_device

    check_flags(args)  # before the model is read
    check_overflow_flags(args)
    device = resolve_device(args.device)
    engine = args.engine if args.compile is None else ("compiled" if args.compile else "eager")
    if eager_only(args):  # sinks and Self-Extend attend their own way, on the eager Decoder
        if engine == "compiled":
            raise UsageError("--context-overflow sinks and --grp-attn-n run on the eager engine; drop --engine compiled")
        engine = "eager"
    own = open_source(args.model)
    # the context and RoPE scaling the flags set, else the model's; Self-Extend reaches past it unscaled
    source = self_extend_source(own, args, scaled_source) if args.grp_attn_n else scaled_source(own, args)
    sampling = sampling_for(given, source.generation, chat=args.chat, greedy=args.greedy)
    plan = decide(source, args.dtype, engine, device, rescaled=source.cfg != own.cfg, kv=args.kv_dtype)
    if args.verbose:  # before a single weight is read
        print(plan.describe(), file=sys.stderr, flush=True)
    built = build(source, plan)
    running = overflow_engine(args, built.engine, built.model)  # itself, unless a flag runs past the context
    history = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:
        _one(source, plan, running, args.prompt, args, sampling, history if args.chat else None)
        return 0
    if sys.stdin.isatty():
        print(f"[{CHAT_HELP}]", file=sys.stderr)
    for text in _messages(sys.stdin):
        if text == "/clear":
            history = history[:1] if args.system else []
            continue
        g = _one(source, plan, running, text, args, sampling, history)
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": g.text}]
    return 0
