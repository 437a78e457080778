"""Start-up: how soon a fresh `llamablock generate` prints its first byte, beside llama.cpp and
transformers, and where its time goes.

Two tables, each side a fresh process on the embedded SmolLM2-135M-Instruct Q4_1 file, one new
token, greedy, the same prompt, best of 3 runs after one warm-up (warm page and build caches):
  * first byte (llamablock: its stdout; llama.cpp through llama-cpp-python and transformers:
    their first generated token, the scripts of bench_generate_command) from the process's spawn,
    llamablock with its compiled engine (built first by `llamablock compile` into a fresh cache;
    full run only) and eager;
  * the stages of the compiled llamablock run, timed inside the process with the command's own
    functions wrapped (`cli.main(["generate", ...])`): Python's start (spawn to the first line),
    importing torch, importing llamablock's command, reading the model (io/source.py open_source:
    the GGUF header and the tokenizer), building it (fast/plan.py decide and build: the weights
    and the compiled programs), and the prompt's prefill to the first byte.
The target: the first byte within 3x llama.cpp's. --quick: the eager engine only, one run,
no other side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec

import torch

from benchmarks.bench_generate_command import _LLAMACPP, _TRANSFORMERS, PROMPT, _ours, _script
from benchmarks.common import Section, verdict

NAME = "startup"
CLAIM = "a warm `llamablock generate` prints its first byte within 3x llama.cpp's time on the same file"

# The command, with its stages timed: each wrapped function records when it returned, and the
# first write to stdout is the first byte. Times are seconds since the epoch, so the parent can
# put Python's own start (its spawn) in front of them.
_STAGES = r"""
import time
marks = {"script": time.time()}
import sys
import torch
marks["import torch"] = time.time()
from llamablock import cli
from llamablock.commands import generate
from llamablock.fast import plan
from llamablock.io import source
marks["import llamablock"] = time.time()

def timed(module, name, label):
    inner = getattr(module, name)
    def wrapper(*a, **k):
        out = inner(*a, **k)
        marks.setdefault(label, time.time())
        return out
    setattr(module, name, wrapper)

timed(source, "open_source", "read the model")
timed(plan, "build", "build it")
write = sys.stdout.write
def first_write(s):
    marks.setdefault("first byte", time.time())
    return write(s)
sys.stdout.write = first_write
status = cli.main(["generate", "--prompt", sys.argv[1], "--greedy", "--max-new-tokens", "1", "--threads", sys.argv[2]])
sys.stdout.write = write
import json
print(json.dumps(marks))
"""


def _stages(env: dict, threads: int) -> dict[str, float]:
    """Seconds each stage of one compiled run took, in order, from its spawn."""
    spawn = time.time()
    out = subprocess.run([sys.executable, "-c", _STAGES, PROMPT, str(threads)], capture_output=True, text=True,
                         env=env)
    if out.returncode != 0:
        raise RuntimeError(f"the timed generate failed (exit status {out.returncode}): {out.stderr.strip()[-1500:]}")
    marks = json.loads(out.stdout.strip().splitlines()[-1])
    stages, last = {}, spawn
    for label in ("script", "import torch", "import llamablock", "read the model", "build it", "first byte"):
        stages[label] = marks[label] - last
        last = marks[label]
    return stages


STAGE_NAMES = {"script": "Python's start (spawn to the script's first line)", "import torch": "import torch",
               "import llamablock": "import llamablock's command (cli, generate, plan, source)",
               "read the model": "read the model: GGUF header, config, tokenizer (open_source)",
               "build it": "build it: weights, engine, compiled programs (decide, build)",
               "first byte": "the prompt's prefill and first token to the first byte (with what the engine loads "
                             "on first use)"}


def run(quick: bool = False) -> list[Section]:
    from llamablock.io.resolve import resolve_model

    path, threads, runs = str(resolve_model(None)), torch.get_num_threads(), 1 if quick else 3
    cmd = ["generate", "--prompt", PROMPT, "--greedy", "--max-new-tokens", "1", "--threads", str(threads)]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        sides = {"llamablock generate, eager engine": lambda: _ours([*cmd, "--engine", "eager"], env)["first"]}
        if not quick:
            subprocess.run([sys.executable, "-m", "llamablock", "compile", "--threads", str(threads)], env=env,
                           check=True, capture_output=True)
            sides = {"llamablock generate (after `llamablock compile`)": lambda: _ours(cmd, env)["first"], **sides}
            if find_spec("llama_cpp") is not None:
                sides["llama.cpp (llama-cpp-python)"] = lambda: _script(_LLAMACPP, path, "1", str(threads), PROMPT)["first"]
            sides["transformers bfloat16"] = lambda: _script(_TRANSFORMERS, path, "2", str(threads), PROMPT)["first"]
        times = {name: [] for name in sides}
        for i in range(runs + (0 if quick else 1)):  # in turn; the first round warms the caches and is dropped
            for name, fn in sides.items():
                t = fn()
                if quick or i > 0:
                    times[name].append(t)
        stages = None if quick else min((_stages(env, threads) for _ in range(runs)), key=lambda s: sum(s.values()))
    best = {name: min(ts) for name, ts in times.items()}
    sec = Section(f"First byte of a fresh process, SmolLM2-135M-Instruct Q4_1, one new token, {threads} thread(s), "
                  f"best of {runs} run(s){'' if quick else ' after a warm-up'}", ["command", "first byte (s)", "runs (s)"])
    for name, ts in times.items():
        sec.rows.append([name, f"{best[name]:.2f}", " ".join(f"{t:.2f}" for t in ts)])
    out = [sec]
    cpp = next((t for n, t in best.items() if n.startswith("llama.cpp")), None)
    ours = next(iter(best.values()))
    if cpp is not None:
        sec.notes.append(verdict("first byte against llama.cpp's", ours / cpp, 3.0, higher_is_better=False))
    elif not quick:
        sec.notes.append("llama.cpp: llama-cpp-python is not installed, so the 3x target is not measured in this run.")
    if stages is not None:
        total = sum(stages.values())
        st = Section("Where the compiled run's first byte goes (its fastest of the runs, stages timed inside the process)",
                     ["stage", "seconds", "share"])
        for label, s in stages.items():
            st.rows.append([STAGE_NAMES[label], f"{s:.2f}", f"{100 * s / total:.0f}%"])
        st.rows.append(["total", f"{total:.2f}", "100%"])
        if cpp is not None:  # the part no change to llamablock can cut, against the target
            st.notes.append(f"Importing torch alone takes {stages['import torch']:.2f} s, "
                            f"{stages['import torch'] / cpp:.1f}x llama.cpp's first byte: while the command imports "
                            "torch, the 3x target cannot be met, whatever the rest takes.")
        out.append(st)
    return out
