"""A 1B-class model in the types people download, beside llama.cpp: decode, prefill, memory.

The embedded 135M file is small enough that a decode step is bound by arithmetic and per-step
overhead; at 1B parameters the step streams most of a gigabyte of weights and memory decides.
This writes llama-architecture files of Llama-3.2-1B's shape (width 2048, 16 layers, 32 query and
8 key-value heads, feed-forward 8192; SmolLM2's tokenizer and vocabulary, the embedding tied) in
each type mix llama.cpp's `llama-quantize` writes (benchmarks/scaled_gguf.py MIXES: Q4_K_M,
Q4_0, Q8_0), once, into the user's cache (`bench/` under `llamablock cache`'s root). Weights are
random, so the text means nothing; speed and memory do not depend on the values (denormals
aside, which the commands flush: llamablock.util.denormals). The embedded SmolLM2-135M file is
measured first, the same way, so that one run gives the README's speed table.

Each side runs as a fresh process, in turn, `ROUNDS` times (medians):
    llamablock   `python -m llamablock generate --model F --greedy --threads T`: a 4-token prompt and
                 64 new tokens (decode), and a 512-token prompt with one new token (prefill), the
                 rates from its summary line; with fresh caches (XDG_CACHE_HOME and inductor's), so without a
                 build the plain command runs eagerly (over these files' blocks, its decode steps in C:
                 fast/decode_step.py), and, full runs only, again after one
                 `llamablock compile --model F`.
    llama.cpp    `llama-bench -m F -p 512 -n 64 -t T -r 1 -o json` (pp512 and tg64), where a
                 llama-bench built by hand is found ($LLAMA_CPP_BIN, else the PATH; the project
                 never installs it).
Peak memory is each process's resident high-water mark (VmHWM, read while it runs), torch's
interpreter included on our side (the row "python + torch" shows that floor). The bandwidth share is decode
tok/s x the bytes a step reads (every tensor but an untied embedding) over a plain read's rate:
the faster of a C read and a float32 matrix-vector product over 1 GiB on the same threads
(benchmarks/read_ceiling.py), taken just before and just after each decode run, the faster of the
two ("runs"). This host's read rate drifts within minutes, so our engines' share, the
one the target judges, is also measured side by side: in a child process with the same cache,
each of PAIRS steps straight after a plain read of the step's bytes (benchmarks/step_share.py; the
median, and the pairs' range). llama-bench, a process of its own, has the per-run share only.
--quick: a tiny file, one round, eager only.
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
from pathlib import Path

import torch

from benchmarks.common import Section, llama_cpp_tool, run_child, verdict
from benchmarks.step_share import CHILD, step_bytes

NAME = "size"
CLAIM = ("at 1B parameters in the files people download (Q4_K_M, Q4_0, Q8_0), the plain `llamablock generate` "
         "decodes >= 1.0x llama.cpp's llama-bench tg64 and prefills >= 1.0x its pp512, its decode streams the "
         "weights at >= 85% of the measured read bandwidth, and its peak memory is <= 1.2x the file plus the KV cache")
SHAPE = (2048, 16, 32, 8, 8192)  # width, layers, heads, kv heads, feed-forward: Llama-3.2-1B's
QUICK_SHAPE = (256, 2, 4, 2, 512)
EMBEDDED = "SmolLM2-135M Q4_1 (embedded)"
ROUNDS, NEW, PROMPT_TOKENS = 3, 64, 512
PAIRS = 24  # read-then-step pairs of benchmarks/step_share.py per engine
PER_CPU_KIND = True  # "## size (AVX2)" beside "## size (AMX)": the ratios hold per CPU kind
COMPILE = True  # False: the plain command without a build only (a shorter run; the title says so)


def files(mixes, shape) -> dict[str, Path]:
    """{mix: path}: each written once into the user's cache (a half-written file is never left)."""
    from benchmarks.scaled_gguf import write_scaled
    from llamablock.io.resolve import resolve_model
    from llamablock.util.files import bench_dir

    folder = bench_dir()
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for mix in mixes:
        path = folder / f"llama-{'x'.join(map(str, shape))}-{mix}.gguf"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            write_scaled(resolve_model(None), tmp, *shape, mix=mix)
            os.replace(tmp, path)
        out[mix] = path
    return out


def _peak(pid: int, last: int) -> int:
    """The process's resident high-water mark (VmHWM) in bytes, or `last` once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return last


def _spawn(argv: list[str], env: dict | None = None) -> tuple[str, str, int]:
    """(stdout, stderr, peak resident bytes) of a process run to its end. The peak is VmHWM, read
    every 20 ms while it runs: it starts afresh at exec, where wait4's ru_maxrss keeps the forking
    parent's resident set (this benchmark's own gigabyte read buffer)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _peak(proc.pid, peak))
            time.sleep(0.02)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} {' '.join(argv[1:4])} failed (exit status {proc.returncode}): "
                           f"{stderr.strip()[-1500:]}")
    return stdout, stderr, peak


def _ours(path: Path, prompt: str, new: int, threads: int, env: dict, *flags: str) -> dict:
    cmd = [sys.executable, "-m", "llamablock", "generate", "--model", str(path), "--prompt", prompt, "--greedy",
           "--max-new-tokens", str(new), "--threads", str(threads), *flags]
    _, err, peak = _spawn(cmd, env)
    summary = err.strip().splitlines()[-1]
    num = lambda pattern: float(re.search(pattern, summary).group(1))  # noqa: E731
    return {"prompt": num(r"(\d+) prompt tokens"), "tokens": num(r"(\d+) new tokens"),
            "prefill": num(r"prefill ([\d.]+) tok/s"), "decode": num(r"decode ([\d.]+) tok/s"), "peak": peak,
            "compiled": "compiled" in summary}


def _theirs(binary: str, path: Path, threads: int) -> dict:
    out, _, peak = _spawn([binary, "-m", str(path), "-p", str(PROMPT_TOKENS), "-n", str(NEW), "-t", str(threads),
                           "-r", "1", "-o", "json"])
    rates = {("prefill" if r["n_prompt"] else "decode"): r["avg_ts"] for r in json.loads(out)}
    return {**rates, "peak": peak}


def _prompt(tokens: int) -> str:
    """A text of about `tokens` tokens of SmolLM2's vocabulary (the summary line gives the count)."""
    from llamablock.io.source import open_source

    tok = open_source(None).tokenizer
    ids = tok.encode(" ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * tokens))
    return tok.decode(ids[:tokens])


def _kv_dtype(path: Path) -> str:
    """The KV cache's dtype that the plain command chooses for `path` (the plan's --kv-dtype auto)."""
    from llamablock.fast.plan import decide
    from llamablock.io.source import open_source

    return decide(open_source(path, tokenizer=False), "auto", "eager").kv


def _floor(env: dict) -> int:
    """Peak resident bytes of the interpreter with torch and llamablock's command line imported."""
    return _spawn([sys.executable, "-c", "import torch, llamablock.cli"], env)[2]


def run(quick: bool = False) -> list[Section]:
    from benchmarks.read_ceiling import read_rate
    from llamablock.diagnostics.kv_calculator import kv_cache_size

    threads, rounds = torch.get_num_threads(), 1 if quick else ROUNDS
    new, prompt_tokens = (8, 64) if quick else (NEW, PROMPT_TOKENS)
    paths = files(("Q4_K_M",) if quick else ("Q4_K_M", "Q4_0", "Q8_0"), QUICK_SHAPE if quick else SHAPE)
    if not quick:  # the embedded file first: the size the engines were tuned on, beside the 1B ones
        from llamablock.io.resolve import resolve_model

        paths = {EMBEDDED: resolve_model(None), **paths}
    binary = None if quick else llama_cpp_tool("llama-bench")
    # Each decode run is held to the faster of the reads just before and after it: one read at a busy
    # moment understated the ceiling (a decode then streamed "123%" of it), and the fastest of the whole
    # run overstated it for every run made in a slower minute of this host's memory.
    mib, reads, read_how = (64 if quick else 1024), [], set()

    def read(repeats: int = 3) -> float:
        """A plain read's bytes/s now, kept in `reads` (and how it was read, for the title)."""
        rate, how = read_rate(mib, repeats=repeats)
        reads.append(rate)
        read_how.add(how)
        return rate

    def bracketed(fn):
        """fn()'s result with 'read': the faster plain read (bytes/s) just before and just after it."""
        before, result = reads[-1], fn()
        return {**result, "read": max(before, read())}

    long_prompt = _prompt(prompt_tokens)
    sec = Section("", ["file", "MiB", "side", "decode tok/s", f"prefill tok/s ({prompt_tokens})", "vs llama.cpp (decode / prefill)",
                   "bandwidth share", "peak MiB", "peak / (file + KV)", "peak less python + torch, / (file + KV)"])
    notes, streamed = [], {}
    with tempfile.TemporaryDirectory() as cache:
        # inductor's own cache fresh too: with only XDG fresh, "compile took" depended on earlier runs' cache
        env = {**os.environ, "XDG_CACHE_HOME": cache, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
        floor = _floor(env)
        for mix, path in paths.items():
            size, (step, cfg) = path.stat().st_size, step_bytes(path)
            streamed[mix] = step
            kv_dtype = _kv_dtype(path)
            kv = kv_cache_size(cfg, prompt_tokens + new, dtype=kv_dtype).total_bytes
            _ours(path, "The", 1, threads, env)  # builds the block kernel into the fresh cache, untimed
            flags = {"llamablock (no build: eager)": ()}
            if not quick and COMPILE:
                t0 = time.perf_counter()
                _spawn([sys.executable, "-m", "llamablock", "compile", "--model", str(path), "--threads", str(threads)],
                       env)
                notes.append(f"{mix}: `llamablock compile` took {time.perf_counter() - t0:.0f} s.")
                flags = {"llamablock (after `llamablock compile`)": (), "llamablock (--engine eager)": ("--engine", "eager")}
            sides = {name: lambda p=path, f=f: _ours(p, "The", new, threads, env, *f) for name, f in flags.items()}
            if binary:
                sides["llama.cpp llama-bench"] = lambda p=path: _theirs(binary, p, threads)
            results = {name: [] for name in sides}
            prefill = {name: [] for name in flags}
            read(7)  # the first decode run's read before (not one from before the build)
            for _ in range(rounds):  # in turn, so that a change in load hits every side
                for name, fn in sides.items():
                    results[name].append(bracketed(fn))
                    if name in prefill:
                        prefill[name].append(_ours(path, long_prompt, 1, threads, env, *flags[name])["prefill"])
                        read()  # the next decode run's read before
            cpp = results.get("llama.cpp llama-bench")
            for name, rs in results.items():  # a build that generate did not use (another source, a damaged
                if name.startswith("llamablock (after") and not all(r["compiled"] for r in rs):  # package) ran eagerly
                    notes.append(f"{mix}: {name} ran eagerly in {sum(not r['compiled'] for r in rs)} of {len(rs)} "
                                 "decode runs (the summary line did not say compiled): its row is not the compiled engine's.")
            step_shares = {name: run_child(CHILD, str(path), "eager" if "eager" in name else "auto", str(threads),
                                           str(2 if quick else PAIRS), env=env) for name in flags}  # step after read
            notes += [f"{mix}: {name}'s step share ran {s['engine']!r}, not the compiled engine." for name, s in
                      step_shares.items() if name.startswith("llamablock (after") and "compiled" not in s["engine"]]
            for name, rs in results.items():
                dec = statistics.median(r["decode"] for r in rs)
                pre = statistics.median(prefill[name] if name in prefill else [r["prefill"] for r in rs])
                peak = statistics.median(r["peak"] for r in rs)
                vs = ""
                if cpp and name in prefill:
                    vs = (f"{dec / statistics.median(r['decode'] for r in cpp):.2f}x / "
                          f"{pre / statistics.median(r['prefill'] for r in cpp):.2f}x")
                beyond = f"{(peak - floor) / (size + kv):.2f}" if name in prefill else ""
                per_run = statistics.median(r["decode"] * step / r["read"] for r in rs)
                st = step_shares.get(name)
                share = (f"{st['share']:.0%} ({st['low']:.0%}-{st['high']:.0%}; runs {per_run:.0%})" if st
                         else f"{per_run:.0%}")
                sec.rows.append([mix, f"{size / 2**20:.0f}", name, f"{dec:.1f}", f"{pre:.1f}", vs, share,
                                 f"{peak / 2**20:.0f}", f"{peak / (size + kv):.2f}", beyond])
    sec.title = (f"{'Tiny files' if quick else 'The embedded SmolLM2-135M file and Llama-3.2-1B-shaped files'} "
                 f"({'x'.join(map(str, QUICK_SHAPE if quick else SHAPE))}: width x layers x heads x kv heads x ffn), "
                 f"{threads} thread(s), medians of {rounds} fresh process(es) per side"
                 f"{'' if COMPILE or quick else ', no `llamablock compile` in this run'}; a plain read streams "
                 f"{min(reads) / 1e9:.1f}-{max(reads) / 1e9:.1f} GB/s on these threads over the run ({'; '.join(sorted(read_how))}; "
                 f"{len(reads)} reads); bandwidth share: ours, each of {2 if quick else PAIRS} steps straight after a plain read "
                 "of its bytes in one process (the median, the pairs' range), then as 'runs' (each decode run against "
                 "the faster read just before and after it, the median), llama-bench's as 'runs' only")
    sec.rows.append(["", "", "python + torch + llamablock.cli imported", "", "", "", "", f"{floor / 2**20:.0f}", "", ""])
    notes.append("Peak is the whole process's; ours includes the interpreter row above (llama-bench's has no such floor); "
                 "the last column takes that floor away. KV: the cache at prompt + new tokens in the plan's --kv-dtype "
                 "auto (diagnostics/kv_calculator.py).")
    if binary is None and not quick:
        notes.append("llama.cpp: no llama-bench found ($LLAMA_CPP_BIN or the PATH), so the ratios to it are not "
                     "measured; build it by hand from llama.cpp's sources (README, benchmarks).")
    for row in sec.rows:
        if row[5]:
            d, p = (float(x.strip().rstrip("x")) for x in row[5].split("/"))
            notes.append(verdict(f"{row[0]} decode, {row[2]}, vs llama.cpp", d, 1.3 if row[0] == EMBEDDED else 1.0))
            notes.append(verdict(f"{row[0]} prefill, {row[2]}, vs llama.cpp", p, 1.0))
        if row[6] and row[2].startswith("llamablock") and row[0] != EMBEDDED:  # the bandwidth and memory targets are 1B's
            notes.append(verdict(f"{row[0]} bandwidth share, {row[2]}", _share(row[6]), 0.85, unit=""))
            notes.append(verdict(f"{row[0]} peak / (file + KV), {row[2]}, the whole process", float(row[8]), 1.2,
                                 higher_is_better=False, unit="x"))
    shares = {(r[0], r[2]): r[6] for r in sec.rows if r[6]}
    for mix in paths:
        cpp = shares.get((mix, "llama.cpp llama-bench"))
        if cpp and mix != EMBEDDED:  # the same reference read on llama.cpp's side: what its kernel reaches here
            notes.append(f"{mix}: llama.cpp's own decode streams {cpp} of the plain read on the same threads.")
    sec.notes = notes
    profiled, profiles = _profile_section(paths, prompt_tokens, threads, mib)
    profiled.notes += _gaps(sec.rows, profiles, streamed, floor)
    return [sec, profiled]


def _share(cell: str) -> float:
    """The share a table cell leads with ("87% (80%-95%; runs 81%)" -> 0.87)."""
    return float(cell.split("%")[0]) / 100


def _profile_section(paths: dict, prompt_tokens: int, threads: int, mib: int) -> tuple[Section, dict]:
    """Where the plain command's step goes, per file (benchmarks/step_profile.py): the measured reason
    behind each decode and prefill ratio above; the section and {file: its profile}, each with 'read':
    the faster plain read just before and after it (for _gaps)."""
    from benchmarks.read_ceiling import read_rate
    from benchmarks.step_profile import profile, rows

    sec = Section(f"Where the plain command's step goes (eager, {threads} thread(s), in this process, the median of "
                  "16 decode steps)", ["file", "step", "ms", "block kernel ms (share)", "attention ms (share)",
                                       "the rest ms (share)"])
    profiles = {}
    for mix, path in paths.items():
        before = read_rate(mib, repeats=3)[0]
        profiles[mix] = profile(path, prompt_tokens, 16)
        profiles[mix]["read"] = max(before, read_rate(mib, repeats=3)[0])
        sec.rows += rows(mix, profiles[mix], prompt_tokens)
    sec.notes.append("The block kernel is every matrix product over the file's blocks (the weights' reads and their "
                     "integer sums); attention is the core over the cache (scores, softmax, values); the rest is the "
                     "step less both: norms, RoPE, the cache's writes, the embedding and Python per layer.")
    return sec, profiles


def _gaps(rows: list[list[str]], profiles: dict, streamed: dict, floor: int) -> list[str]:
    """What would close each miss of the eager rows (the profiled engine), from benchmarks/size_gaps.py."""
    from benchmarks.size_gaps import bandwidth_gap, memory_gap, rate_gap

    out = []
    for row in rows:
        mix, side = row[0], row[2]
        if side != "llamablock (--engine eager)" and not side.startswith("llamablock (no build"):
            continue
        prof = profiles[mix]
        if row[5]:
            d, p = (float(x.strip().rstrip("x")) for x in row[5].split("/"))
            out.append(rate_gap(f"{mix} decode, eager", d, 1.3 if mix == EMBEDDED else 1.0, prof["decode"]))
            out.append(rate_gap(f"{mix} prefill, eager", p, 1.0, prof["prefill"]))
        if mix != EMBEDDED:
            out.append(bandwidth_gap(f"{mix} bandwidth share, eager", _share(row[6]), 0.85,
                                     prof["decode"], streamed[mix], prof["read"]))
            out.append(memory_gap(f"{mix} peak, eager", float(row[8]), float(row[9]), 1.2, floor / 2**20))
    return [f"What would close it: {g}" for g in out if g]
