"""`llamablock compile`: build the compiled engine for a model once, so that `generate` uses it.

The engine (llamablock.fast.compiled.aoti_engine.AOTIEngine) compiles its decode step and prefill for
one model file, format and cache length; this command does it ahead of time, stage by stage,
with the elapsed time and the previous build's total, and records it (llamablock.fast.compiled.builds) so
that `llamablock generate` picks the compiled engine by default from then on. `--batch B` builds
the step for B sequences at once instead (no compiled prefill), which `llamablock serve --parallel
B` picks up the same way (llamablock.fast.compiled.batch_compiled).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from llamablock.fast.formats import CHOICES
from llamablock.io.scaling_flags import add_scaling_arguments


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="a .gguf file, a transformers directory or a name from `llamablock models` "
                        "(default: smollm2-135m-instruct)")
    p.add_argument("--dtype", choices=CHOICES, default="auto",
                   help="the format to compile for; auto: the file's own (blocks where every layer matrix is Q4_0, "
                        "Q4_1 or Q8_0, else its majority format) (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=512,
                   help="prompt + new tokens the engine holds; rounded up to a power of two (default: %(default)s)")
    p.add_argument("--batch", type=int, default=1, metavar="B",
                   help="sequences the decode step takes at once: `llamablock serve --parallel B` decodes its "
                        "requests' rows with it (default: %(default)s, the engine of `llamablock generate`)")
    p.add_argument("--kv-dtype", default="auto", metavar="{auto,float32,bfloat16,float16}",
                   help="the KV cache's dtype the programs take, as `generate --kv-dtype` (default: %(default)s)")
    p.add_argument("--no-autotune", action="store_true",
                   help="inductor's default kernels instead of autotuned GEMM templates (faster to build, slower to run)")
    add_scaling_arguments(p)  # a build for a context and RoPE scaling of the flags': generate with them uses it


def run(args) -> int:
    import torch

    from llamablock.fast.compiled import builds
    from llamablock.fast.plan import build, decide
    from llamablock.io.scaling_flags import check_flags, scaled_source
    from llamablock.io.source import open_source

    if args.tokens < 2:
        raise ValueError(f"--tokens must be at least 2, got {args.tokens}")
    if args.batch < 1:
        raise ValueError(f"--batch must be a positive integer, got {args.batch}")
    check_flags(args)
    own = open_source(args.model, tokenizer=False)
    source = scaled_source(own, args)  # the flags' context and RoPE scaling, else the model's own
    if args.tokens > source.cfg.max_seq_len:
        raise ValueError(f"--tokens {args.tokens} exceeds the model's context of {source.cfg.max_seq_len}")
    plan = decide(source, args.dtype, "compiled", batch=args.batch, kv=args.kv_dtype, rescaled=source.cfg != own.cfg)
    fmt, start = plan.fmt, time.perf_counter()

    def report(stage: str) -> None:
        print(f"  [{time.perf_counter() - start:6.1f} s] {stage}", flush=True)

    last = builds.last_build_seconds(source.path, builds.build_name(fmt, plan.kv, plan.activations, plan.scaled))
    print(f"compiling {source.path.name} in {fmt}" + (f" (the last build took {last:.0f} s)" if last else ""), flush=True)
    engine = build(source, replace(plan, autotune=not args.no_autotune), notify=report).engine
    with torch.no_grad():
        seconds = engine.build(args.tokens, report)
    if engine.running.get("step") == "eager":
        print(f"  [{time.perf_counter() - start:6.1f} s] no compiled decode step builds on this CPU in {fmt} "
              "(the lines above say why): `llamablock generate` runs the eager engine; another --dtype may build",
              flush=True)
        return 0
    builds.record_engine(source.path, engine, seconds, plan.scaled)
    flags = " with the same context flags" if plan.scaled else ""
    user = (f"`llamablock generate --model {args.model or source.path.name}`{flags}" if args.batch == 1 else
            f"`llamablock serve --model {args.model or source.path.name} --parallel {args.batch}`")
    print(f"  [{time.perf_counter() - start:6.1f} s] done: {engine.describe()}; {seconds:.0f} s compiling, the rest "
          f"loaded from the cache; {user} now uses it for requests of up to {engine.length} tokens",
          file=sys.stdout, flush=True)
    return 0
