"""Decode and prefill speed: llamablock against transformers on the same GGUF, in one run.

Both load the same file (transformers: `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`,
which dequantizes with the same `gguf` kernels), in the same dtype, and run the same prompt:
    prefill   one forward pass over the prompt with a fresh cache          (prompt tokens / s)
    decode    greedy steps of one token each, reading the cache            (steps / s)
Both compute logits for the last prompt position only (ours `last_only`, transformers'
`logits_to_keep=1`, as its `generate` does). Each is the median over --repeat runs, after a
warm-up. transformers runs its default DynamicCache with sdpa attention, called step by step
without generate's bookkeeping; the "generate()" rows time each library's whole generation
call instead (decode rate = (new - 1) / (total - prefill)). Without the optional `kernels`
package transformers dequantizes the GGUF to dense weights, as we do. llama.cpp (llama-cpp-python, on the quantized file itself) is measured only if
already installed; it is never installed by this project.
The ceiling line: a decode step must read every weight once, so tokens/s <= copy bandwidth /
weight bytes (bandwidth measured here by copying a 256 MiB tensor, counting read + write).

    python benchmarks/decode.py [--model NAME|PATH.gguf] [--dtype float32 bfloat16] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llamablock.io.gguf import config_from_gguf, gguf_decoder, open_gguf  # noqa: E402
from llamablock.io.resolve import resolve_model  # noqa: E402
from llamablock.kv_cache import KVCache  # noqa: E402
from llamablock.runtime.engine import EagerEngine  # noqa: E402
from llamablock.runtime.generate import generate  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _median_time(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _rates(prefill, decode, n: int, new: int, repeat: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s): median prefill time; median decode time after one warm-up
    (`decode` times only its decode steps, not the prefill it starts with)."""
    p = _median_time(prefill, repeat)
    decode()
    d = statistics.median(decode() for _ in range(repeat))
    return n / p, new / d


@torch.no_grad()
def ours_speed(model, ids: torch.Tensor, new: int, repeat: int) -> tuple[float, float]:
    n = ids.shape[1]

    def prefill():
        cache = KVCache(model.cfg, 1, n + new, dtype=model.embed.weight.dtype)
        return model(ids, cache=cache, last_only=True)[:, -1], cache

    def decode():
        logits, cache = prefill()
        t = time.perf_counter()
        for _ in range(new):
            logits = model(logits.argmax(-1, keepdim=True), cache=cache)[:, -1]
        return time.perf_counter() - t

    return _rates(prefill, decode, n, new, repeat)


@torch.no_grad()
def hf_speed(model, ids: torch.Tensor, new: int, repeat: int) -> tuple[float, float]:
    from transformers import DynamicCache

    n = ids.shape[1]

    def prefill():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)  # as generate() does
        return out.logits[:, -1], cache

    def decode():
        logits, cache = prefill()
        pos = n
        t = time.perf_counter()
        for _ in range(new):
            tok = logits.argmax(-1, keepdim=True)
            out = model(input_ids=tok, cache=cache, use_cache=True,
                        position_ids=torch.tensor([[pos]]), cache_position=torch.tensor([pos]), logits_to_keep=1)
            logits, pos = out.logits[:, -1], pos + 1
        return time.perf_counter() - t

    return _rates(prefill, decode, n, new, repeat)


@torch.no_grad()
def generate_call_speed(fn, prefill_s: float, new: int, repeat: int) -> float:
    """Decode tokens/s of a whole generation call, its prefill time taken out."""
    total = _median_time(fn, repeat)
    return (new - 1) / max(total - prefill_s, 1e-9)


_LLAMACPP_CHILD = r"""
import json, sys, time
from llama_cpp import Llama
path, ids, new, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pre = json.loads(sys.argv[5])  # the prefill's prompt (may be longer than the decode's)
llm = Llama(model_path=path, n_ctx=max(len(ids) + new, len(pre)) + 8, n_batch=max(len(ids), len(pre)),
            n_threads=threads, verbose=False)
def run():
    llm.reset()
    t = time.perf_counter()
    llm.eval(pre)
    p = time.perf_counter() - t
    llm.reset()
    llm.eval(ids)
    t = time.perf_counter()
    for _ in range(new):
        llm.eval([llm.sample(temp=0.0)])
    return p, time.perf_counter() - t
run()  # warm-up
runs = [run() for _ in range(3)]
print(json.dumps([len(pre) / min(r[0] for r in runs), new / min(r[1] for r in runs)]))
"""


def llamacpp_speed(path: Path, ids: list[int], new: int, threads: int,
                   prefill_ids: list[int] | None = None) -> tuple[float, float] | str | None:
    """(prefill tokens/s over `prefill_ids` (default `ids`), decode tokens/s of `new` greedy steps after
    `ids`) of llama.cpp on the file itself, best of 3 after a warm-up;
    None when llama-cpp-python is not installed; a string saying what failed otherwise.

    It runs in a child process: llama.cpp's own OpenMP and kernels then never share a process
    with torch's, and a crash there (a build for the wrong CPU) cannot take the benchmark down.
    """
    import importlib.util
    import json
    import subprocess

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    r = subprocess.run([sys.executable, "-c", _LLAMACPP_CHILD, str(path), json.dumps(ids), str(new), str(threads),
                        json.dumps(prefill_ids or ids)], capture_output=True, text=True)
    if r.returncode != 0:
        return f"llama-cpp-python failed (exit status {r.returncode}): {(r.stderr.strip().splitlines() or [''])[-1][:200]}"
    prefill, decode = json.loads(r.stdout.strip().splitlines()[-1])
    return prefill, decode


def copy_bandwidth() -> float:
    """Bytes per second moved by a large tensor copy (read + write)."""
    a = torch.empty(256 * 2**20 // 4, dtype=torch.float32).fill_(1.0)
    b = torch.empty_like(a)
    t = _median_time(lambda: b.copy_(a), 5)
    return 2 * a.numel() * 4 / t


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied head counted once


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="embedded model name or .gguf path (default: smollm2-135m-instruct)")
    ap.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16"], help="dtypes to run")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="prompt length (default: %(default)s)")
    ap.add_argument("--new-tokens", type=int, default=64, help="decode steps (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per measurement, median (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: %(default)s)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    path = resolve_model(args.model)
    reader = open_gguf(path)
    from llamablock.io.tokenizer import tokenizer_from_gguf

    tok = tokenizer_from_gguf(reader)
    text = "The history of the city begins with a small settlement on the river, where traders met " * 8
    prompt = tok.encode(text)[: args.prompt_tokens]
    ids = torch.tensor([prompt])
    bw = copy_bandwidth()
    print(f"model {path.name}, prompt {len(prompt)} tokens, {args.new_tokens} decode steps, {args.threads} threads, "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
    header = f"{'dtype':<10}{'implementation':<22}{'prefill tok/s':>14}{'decode tok/s':>14}{'prefill x':>11}{'decode x':>10}"
    print(header)
    print("-" * len(header))
    for name in args.dtype:
        dtype = DTYPES[name]
        ours = gguf_decoder(reader, config_from_gguf(reader).replace(rope_layout="half"), dtype)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
        o = ours_speed(ours, ids, args.new_tokens, args.repeat)
        h = hf_speed(hf, ids, args.new_tokens, args.repeat)
        print(f"{name:<10}{'transformers':<22}{h[0]:>14.1f}{h[1]:>14.1f}{1.0:>11.2f}{1.0:>10.2f}")
        print(f"{name:<10}{'llamablock':<22}{o[0]:>14.1f}{o[1]:>14.1f}{o[0] / h[0]:>11.2f}{o[1] / h[1]:>10.2f}")
        hg = generate_call_speed(lambda hf=hf: hf.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                                     do_sample=False, pad_token_id=0), len(prompt) / h[0],
                                 args.new_tokens, args.repeat)
        og = generate_call_speed(lambda ours=ours: generate(EagerEngine(ours), prompt, args.new_tokens, eos_ids=[]), len(prompt) / o[0],
                                 args.new_tokens, args.repeat)
        print(f"{name:<10}{'transformers generate()':<22}{'':>14}{hg:>14.1f}{'':>11}{1.0:>10.2f}")
        print(f"{name:<10}{'llamablock generate()':<22}{'':>14}{og:>14.1f}{'':>11}{og / hg:>10.2f}")
        wb = weight_bytes(ours)
        print(f"{name:<10}{'ceiling (bandwidth)':<22}{'':>14}{bw / wb:>14.1f}{'':>11}{'':>10}"
              f"   {wb / 2**20:.0f} MiB of weights per token at {bw / 1e9:.1f} GB/s copy bandwidth")
        del ours, hf
    cpp = llamacpp_speed(path, prompt, args.new_tokens, args.threads)
    if cpp is None:
        print("llama.cpp: llama-cpp-python is not installed (optional; not installed by this project)")
    elif isinstance(cpp, str):
        print(f"llama.cpp: {cpp}")
    else:
        print(f"{'gguf':<10}{'llama.cpp (' + path.suffix + ')':<22}{cpp[0]:>14.1f}{cpp[1]:>14.1f}")


if __name__ == "__main__":
    main()
