"""The plain command as a user runs it: `llamablock generate --prompt ...` after one build.

The targets are about the command, not the engine inside it: after `llamablock compile`,
the plain `llamablock generate --prompt P` (engine and format left to their defaults) should
decode at least 3x transformers' bfloat16 speed and 1.5x llama.cpp on the same file (1.2x on a CPU
without AVX-512: llama_cpp_target), and print its first token within 5 s of the process starting
and within 3x llama.cpp's. Each side runs as a fresh process, as a user
would start it, on the embedded SmolLM2-135M-Instruct Q4_1 file, greedy, the same prompt:
    llamablock    `python -m llamablock generate --prompt P --greedy --max-new-tokens 64 --threads T`,
                  with its own, fresh cache directory (XDG_CACHE_HOME) built by `llamablock compile`;
                  first token: the first bytes on its stdout (it streams and flushes each piece);
                  decode: the tok/s of its summary line
    transformers  a script: from_pretrained(the GGUF, dtype=bfloat16) and generate() with a streamer
    llama.cpp     a script with llama-cpp-python (when installed; this project never installs it)
Every process uses T torch/llama.cpp threads, the benchmark run's count; each is run 3 times in
turn (the medians are reported). Greedy decoding may stop at end-of-sequence before 64 tokens:
the rates are per generated token, so they compare regardless.
--quick: the eager engine (no build), 8 tokens, one run, llamablock only.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec

import torch

from benchmarks.common import Section, verdict
from llamablock.util.cpu import this_cpu

NAME = "generate_command"
CLAIM = ("after one build, the plain `llamablock generate --prompt ...` decodes >= 3x transformers' bfloat16 and "
         ">= 1.5x llama.cpp on the same file (1.2x without AVX-512), its first token within 5 s of the process "
         "starting and within 3x llama.cpp's")
PROMPT = "The history of the city of Paris begins"

_TRANSFORMERS = r"""
import time
t_start = time.perf_counter()
import json, sys, torch, transformers
path, new, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
from pathlib import Path
p = Path(path)
tok = transformers.AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
model = transformers.AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.bfloat16).eval()
times = []
class Clock(transformers.generation.streamers.BaseStreamer):
    def put(self, value):
        times.append(time.perf_counter())
    def end(self):
        pass
ids = tok(sys.argv[4], return_tensors="pt").input_ids
model.generate(ids, max_new_tokens=new, do_sample=False, streamer=Clock())
first, last = times[1], times[-1]  # the streamer's first put is the prompt itself
print(json.dumps({"first": first - t_start, "decode": (len(times) - 2) / (last - first), "tokens": len(times) - 1}))
"""

_LLAMACPP = r"""
import time
t_start = time.perf_counter()
import json, sys
from llama_cpp import Llama
path, new, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_ctx=512, n_threads=threads, verbose=False)
ids = llm.tokenize(sys.argv[4].encode())
llm.eval(ids)
tok = llm.sample(temp=0.0)
first = time.perf_counter()
steps = 0
while steps < new - 1 and tok != llm.token_eos():
    llm.eval([tok])
    tok = llm.sample(temp=0.0)
    steps += 1
rate = steps / (time.perf_counter() - first)
import llama_cpp
build = llama_cpp.llama_print_system_info().decode().strip()
print(json.dumps({"first": first - t_start, "decode": rate, "tokens": steps + 1, "build": build}))
"""


def _script(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child failed (exit status {out.returncode}): {out.stderr.strip()[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ours(argv: list[str], env: dict) -> dict:
    """Seconds from spawning the command to its first stdout bytes, and its summary line's rates."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "llamablock", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.read(1)
    first = time.perf_counter() - t0
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"llamablock {argv[0]} failed (exit status {proc.returncode}): {err.decode()[-1500:]}")
    summary = err.decode().strip().splitlines()[-1]
    decode = re.search(r"decode ([\d.]+) tok/s", summary)
    tokens = re.search(r"(\d+) new tokens", summary)
    return {"first": first, "decode": float(decode.group(1)), "tokens": int(tokens.group(1)),
            "compiled": "compiled decode" in summary, "summary": summary}


def run(quick: bool = False) -> list[Section]:
    from llamablock.io.resolve import resolve_model

    path = str(resolve_model(None))
    threads, new, runs = torch.get_num_threads(), 8 if quick else 64, 1 if quick else 3
    sec = Section(f"`llamablock generate --prompt \"{PROMPT}\"` from process start, SmolLM2-135M-Instruct Q4_1, "
                  f"greedy, at most {new} tokens, {threads} thread(s), medians of {runs} run(s)",
                  ["command", "build (s)", "first token at (s)", "decode tok/s", "tokens"])
    cmd = ["generate", "--prompt", PROMPT, "--greedy", "--max-new-tokens", str(new), "--threads", str(threads)]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        build = ""
        if quick:
            cmd += ["--engine", "eager"]
        else:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "llamablock", "compile", "--threads", str(threads)], env=env,
                           check=True, capture_output=True)
            build = f"{time.perf_counter() - t0:.0f}"
        sides = {"llamablock generate (defaults after `llamablock compile`)": lambda: _ours(cmd, env)}
        if not quick:
            sides["transformers bfloat16 (from_pretrained + generate)"] = (
                lambda: _script(_TRANSFORMERS, path, str(new), str(threads), PROMPT))
            if find_spec("llama_cpp") is not None:
                sides["llama.cpp (llama-cpp-python, the Q4_1 file)"] = (
                    lambda: _script(_LLAMACPP, path, str(new), str(threads), PROMPT))
        results = {name: [] for name in sides}
        for _ in range(runs):  # in turn, so that a change in load hits every side
            for name, fn in sides.items():
                results[name].append(fn())
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("first", "decode", "tokens")}
           for name, rs in results.items()}
    for name, m in med.items():
        sec.rows.append([name, build if name.startswith("llamablock") else "", f"{m['first']:.2f}",
                         f"{m['decode']:.1f}", f"{m['tokens']:.0f}"])
    ours_name = next(iter(med))
    ours = med[ours_name]
    engines = {r["compiled"] for r in results[ours_name]}
    sec.notes.append("llamablock's summary line said: " + results[ours_name][-1]["summary"])
    sec.notes.append("Each rate here is one generation in a fresh process, as a user runs it, for every side alike; "
                     "the `decode` tables time the engines another way (inside one process; llama.cpp best of 3 after "
                     "a warm-up), at another moment of the machine's load, so compare ratios within a table.")
    if not quick and engines != {True}:
        sec.notes.append("The command did not run the compiled engine in every run: the targets below do not apply.")
    if quick:
        return [sec]
    sec.notes.append(verdict("first token of a warm run from process start", ours["first"], 5.0,
                             higher_is_better=False, unit=" s"))
    tf = next(m for n, m in med.items() if n.startswith("transformers"))
    sec.notes.append(verdict("plain command's decode vs transformers bfloat16", ours["decode"] / tf["decode"], 3.0))
    cpp = next((m for n, m in med.items() if n.startswith("llama.cpp")), None)
    cpp_runs = next((rs for n, rs in results.items() if n.startswith("llama.cpp")), None)
    if cpp_runs:
        sec.notes.append(f"llama.cpp's build, as its llama_print_system_info reports it: {cpp_runs[-1]['build']}")
    target = llama_cpp_target()
    if cpp is None:
        sec.notes.append(f"llama.cpp: llama-cpp-python is not installed, so the {target:g}x target is not measured in "
                         "this run.")
    else:
        sec.notes.append(verdict(f"plain command's decode vs llama.cpp on the same file ({this_cpu().kind})",
                                 ours["decode"] / cpp["decode"], target))
        sec.notes.append(verdict("first token from process start vs llama.cpp's", ours["first"] / cpp["first"], 3.0,
                                 higher_is_better=False))
        sec.notes.append(_bandwidth_note(path, {"llamablock": ours["decode"], "llama.cpp": cpp["decode"]}))
    return [sec]


def _bandwidth_note(path: str, rates: dict[str, float]) -> str:
    """Where both decode rates stand against memory: the file's tensor bytes (what a token reads, the
    embedding row aside) times the rate, beside the machine's copy bandwidth (benchmarks/decode.py)."""
    from benchmarks.decode import copy_bandwidth
    from llamablock.io.gguf import open_gguf

    reader = open_gguf(path)
    nbytes = sum(int(t.n_bytes) for t in reader.tensors)
    bw = copy_bandwidth()
    read = ", ".join(f"{name} {rate * nbytes / 1e9:.1f} GB/s ({100 * rate * nbytes / bw:.0f}%)"
                     for name, rate in rates.items())
    top = max(rates.values()) * nbytes / bw
    where = ("well below it, so neither is bound by memory but by its computation (`bench file_blocks` profiles "
             "where ours goes)" if top < 0.7 else "near it: memory bounds the faster side")
    return (f"Weights read per token: {nbytes / 2**20:.0f} MiB. At the decode rates above: {read} of the copy "
            f"bandwidth, {bw / 1e9:.1f} GB/s (read + write of a 256 MiB copy, at this run's torch threads): {where}.")


def llama_cpp_target() -> float:
    """The decode target against llama.cpp: 1.5x where ATen runs AVX-512 (or AMX) kernels, 1.2x
    on the CPUs most people have (AVX2, NEON), where neither side has the wide vector units."""
    return 1.5 if this_cpu().kind in ("AVX-512", "AMX") else 1.2
