"""`llamablock serve` under concurrent clients: continuous batching measured from the client's side.

The claim: several clients streaming at once each get their answer at nearly the speed of one,
because a batch of decode steps costs little more than one on a machine whose decoding is bound by
reading the weights. Targets: with 4 concurrent clients, aggregate decode >= 3x one client's and
>= llama.cpp's `llama-server -np 4`; time to first token p95 with 4 clients within 2x one client's
and within 2x llama-server -np 4's (the worst first token, beside llama.cpp's, each with its defaults).

How: the server runs as a user starts it, `python -m llamablock serve --parallel 4` on the embedded
SmolLM2-135M-Instruct Q4_1 file, in a child process, twice: on the eager engine (`--engine eager`)
and on the compiled steps for 1 and 4 rows, which `llamablock compile --batch 4` builds first (its time is
reported; a build from an earlier run is loaded from the compile cache). For 1, 2, 4 and 8 clients at once, each
client is the official `openai` client on its own thread, streaming a chat completion (greedy, a
different question each, max_tokens 128). Per stream: the time to its first content chunk and its
decode rate (tokens after the first over the time after the first); per level: the aggregate rate
(every stream's tokens over the level's wall time, first request sent to last token). Greedy
decoding may end at end-of-sequence before 128 tokens: the rates are per generated token.
llama.cpp's `llama-server` is run the same way where it is on PATH (this project never builds or
installs it); otherwise the report says it is absent.
Four parallel requests on every server, as llama-server's `-np 4`: the 8-client level queues four.
--quick: 1 and 2 clients, 8 tokens each, the eager engine only.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

import torch

from benchmarks.common import Section, verdict

NAME = "serve"
CLAIM = ("with 4 concurrent streaming clients, `llamablock serve` decodes >= 3x one client's aggregate and >= "
         "llama.cpp's server -np 4, its first-token p95 within 2x one client's and within 2x llama-server's")
QUESTIONS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle stays upright.",
             "Describe the city of Paris to a child.", "Give advice to a new gardener.",
             "Tell the history of the printing press.", "Explain why the sky is blue.",
             "Describe a day in the life of a baker.", "Write a letter to a friend about the sea."]
START_S = 300  # the longest a server may take to answer its first request (a hang guard)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str) -> None:
    import httpx

    end = time.monotonic() + START_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited (status {proc.returncode}): {proc.stderr.read().decode()[-1500:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server at {url} did not answer within {START_S} s")


def _stream(client, model: str, question: str, tokens: int, start: threading.Barrier) -> dict:
    start.wait()
    t0 = time.perf_counter()
    first = last = None
    usage = None
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                                max_tokens=tokens, temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
    n = usage or 0
    return {"start": t0, "ttft": (first or t0) - t0, "end": last or t0, "tokens": n,
            "rate": (n - 1) / (last - first) if first and last and last > first and n > 1 else float("nan")}


def _level(url: str, model: str, clients: int, tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    barrier = threading.Barrier(clients)
    out: list[dict] = [None] * clients

    def run(i: int) -> None:
        out[i] = _stream(client, model, QUESTIONS[i % len(QUESTIONS)], tokens, barrier)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(r["end"] for r in out) - min(r["start"] for r in out)
    ttfts = sorted(r["ttft"] for r in out)
    return {"aggregate": sum(r["tokens"] for r in out) / wall, "ttft_p50": statistics.median(ttfts),
            "ttft_p95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
            "per_stream": statistics.median(r["rate"] for r in out), "tokens": sum(r["tokens"] for r in out)}


def _serve(argv: list[str], url: str, model: str, levels: list[int], tokens: int, env: dict) -> dict:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        _wait_ready(proc, url)
        _level(url, model, 1, 4)  # warm-up: the first request's one-time costs
        return {c: _level(url, model, c, tokens) for c in levels}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# Why the ratios are what they are: the engines themselves, in a child process as the server loads
# them, without HTTP. One step at 1 and 4 rows (the compiled engine's two buckets) and the prefill of
# 1 and 4 of the benchmark's chat prompts together, interleaved (medians).
ENGINE_CHILD = r"""
import json, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from llamablock.util.timing import time_calls
from llamablock.web.generation import load_served
out = {}
for engine in ("eager", "compiled"):
    served = load_served(None, max_queue=1, parallel=4, engine=engine)
    served.worker.close()
    eng, tok = served.worker.engine, served.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]), add_special_tokens=False)
               for q in json.loads(sys.argv[2])]
    def prefill(n):
        rows = [eng.add(p, 64) for p in prompts[:n]]
        while any(r.index is None for r in rows):
            eng.prefill_next([r for r in rows if r.index is None])
        return rows
    def clear(rows):
        for r in rows:
            eng.remove(r)
    def step(n):
        rows = prefill(n)
        t = time_calls({"step": lambda: [eng.step(torch.ones(n, dtype=torch.long)) for _ in range(8)]}, 5, 1)
        clear(rows)
        return t["step"]["median"] / 8
    steps = {n: step(n) for n in (1, 4)}
    t = time_calls({n: (lambda n=n: clear(prefill(n))) for n in (1, 4)}, 5, 1)
    out[engine] = {"step": steps, "prefill": {n: t[n]["median"] for n in (1, 4)},
                   "prompt": sum(map(len, prompts[:4])) / 4}
print(json.dumps(out))
"""


def _engines(threads: int) -> dict:
    import json

    from benchmarks.common import run_child

    return run_child(ENGINE_CHILD, str(threads), json.dumps(QUESTIONS[:4]))


def run(quick: bool = False) -> list[Section]:
    from llamablock.io.resolve import resolve_model

    path = str(resolve_model(None))
    threads = torch.get_num_threads()
    levels, tokens = ([1, 2], 8) if quick else ([1, 2, 4, 8], 128)
    sec = Section(f"`llamablock serve --parallel 4`, SmolLM2-135M-Instruct Q4_1, concurrent streaming chat clients "
                  f"(the openai client), greedy, at most {tokens} tokens each, {threads} thread(s)",
                  ["server", "clients", "aggregate tok/s", "TTFT p50 (s)", "TTFT p95 (s)", "per-stream tok/s",
                   "tokens"])

    def ours(*flags: str) -> dict:
        port = _port()
        return _serve([sys.executable, "-m", "llamablock", "serve", "--port", str(port), "--parallel", "4",
                       "--max-queue", "16", "--threads", str(threads), *flags], f"http://127.0.0.1:{port}",
                      "smollm2-135m-instruct", levels, tokens, dict(os.environ))

    results = {"llamablock serve, eager": ours("--engine", "eager")}
    if not quick:
        t = time.perf_counter()
        build = subprocess.run([sys.executable, "-m", "llamablock", "compile", "--batch", "4", "--threads", str(threads)],
                               capture_output=True, text=True)
        seconds = time.perf_counter() - t
        if build.returncode == 0:
            results["llamablock serve, compiled (steps for 1 and 4 rows)"] = ours("--engine", "compiled")
            last = build.stdout.strip().splitlines()[-1] if build.stdout.strip() else ""
            sec.notes.append(f"`llamablock compile --batch 4` took {seconds:.0f} s in this run (0 compiling when an "
                             f"earlier run's build was in the compile cache): {last.split('] ', 1)[-1][:200]}")
        else:
            sec.notes.append(f"`llamablock compile --batch 4` failed (status {build.returncode}): "
                             f"{build.stderr.strip().splitlines()[-1][:200] if build.stderr.strip() else ''}")
    server = shutil.which("llama-server")
    if server and not quick:
        said = subprocess.run([server, "--version"], capture_output=True, text=True)
        version = "; ".join((said.stdout + said.stderr).strip().splitlines()[-2:])
        sec.notes.append(f"llama.cpp: `llama-server` from PATH ({version}), -t {threads}, -c 4096 (1024 tokens per slot).")
        port = _port()
        url = f"http://127.0.0.1:{port}"
        results["llama.cpp llama-server -np 4"] = _serve(
            [server, "-m", path, "--port", str(port), "-np", "4", "-c", "4096", "-t", str(threads)], url, path,
            levels, tokens, dict(os.environ))
    for name, by_level in results.items():
        for c, r in by_level.items():
            sec.rows.append([name, str(c), f"{r['aggregate']:.1f}", f"{r['ttft_p50']:.2f}", f"{r['ttft_p95']:.2f}",
                             f"{r['per_stream']:.1f}", str(r["tokens"])])
    if server is None:
        sec.notes.append("llama.cpp: `llama-server` is not on PATH on this machine (this project never builds it), "
                         "so the comparison with llama.cpp's server is absent from this run.")
    if quick:
        return [sec]
    engines = _engines(threads)
    why = Section(f"Why: the engines of `llamablock serve --parallel 4` without HTTP, {threads} thread(s): one decode "
                  "step at 1 and 4 rows, and the prefill of 1 and of 4 of the chat prompts above together (medians)",
                  ["engine", "step, 1 row (ms)", "step, 4 rows (ms)", "4 x step(1) / step(4)",
                   "prefill, 1 prompt (s)", "prefill, 4 prompts (s)", "prefill(4) / prefill(1)"])
    for name, e in engines.items():
        step, pre = e["step"], e["prefill"]
        why.rows.append([name, f"{step['1'] * 1e3:.1f}", f"{step['4'] * 1e3:.1f}", f"{4 * step['1'] / step['4']:.2f}x",
                         f"{pre['1']:.3f}", f"{pre['4']:.3f}", f"{pre['4'] / pre['1']:.2f}x"])
    why.notes.append(f"A prompt here is {engines['eager']['prompt']:.0f} tokens on average. With 4 clients decoding, "
                     "the aggregate can reach at most 4 x step(1) / step(4) times one client's; their first tokens "
                     "come after one prefill of all 4 prompts, prefill(4) / prefill(1) times one client's. Where "
                     "those ratios are past the targets, the step and the prefill are bound by the CPU's arithmetic, "
                     "not by reading the weights, and batching cannot reach the targets on this machine.")
    cpp = results.get("llama.cpp llama-server -np 4")
    for name, by_level in results.items():
        if not name.startswith("llamablock"):
            continue
        one, four = by_level[1], by_level[4]
        sec.notes.append(f"{name}: " + verdict("aggregate decode, 4 clients vs 1", four["aggregate"] / one["aggregate"],
                                               3.0))
        sec.notes.append(f"{name}: " + verdict("TTFT p95, 4 clients vs 1", four["ttft_p95"] / one["ttft_p95"], 2.0,
                                               higher_is_better=False))
        if cpp is not None:
            sec.notes.append(f"{name}: " + verdict("aggregate decode with 4 clients vs llama-server -np 4",
                                                   four["aggregate"] / cpp[4]["aggregate"], 1.0))
            sec.notes.append(f"{name}: " + verdict("TTFT p95 with 4 clients vs llama-server -np 4's",
                                                   four["ttft_p95"] / cpp[4]["ttft_p95"], 2.0, higher_is_better=False))
    return [sec, why]
