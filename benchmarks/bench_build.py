"""The compiled engine's cold build against its decode speed: autotuned GEMM templates or not.

`llamablock compile` autotunes by default (inductor's max-autotune restricted to its C++ GEMM
templates, llamablock.fast.compiled.build_options.inductor_options); `--no-autotune` keeps inductor's
default kernels. Each row is a child process with its own empty inductor cache that builds
AOTIEngine for the format `llamablock generate` would use (the file's own, `own_format`),
timing the cold build (`engine.build`, every package compiled), then decodes 64 tokens greedily
through `generate` on one thread, twice, keeping the faster. The table is the trade-off the
default is chosen by: build seconds saved against decode speed lost.
SmolLM2-135M-Instruct (the embedded file). --quick skips it: two cold builds take minutes even for a
tiny model, and the pieces it times are tested on their own (tests/fast/compiled/test_compiled_decode.py,
tests/faces/test_compile_cli.py).
"""

from __future__ import annotations

import os
import tempfile

from benchmarks.common import Section, run_child

NAME = "build"
CLAIM = "cut the cold build time where it costs little speed: autotuning's build seconds against its decode gain"

CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.runtime.generate import generate
from llamablock.fast.plan import own_format
from llamablock.fast.formats import load_dtype
from llamablock.io.loading import load_decoder
from llamablock.io.source import open_source
autotune = sys.argv[1] == "on"
source = open_source(None, tokenizer=False)
fmt = own_format(source)
model = load_decoder(source, load_dtype(fmt))
engine = AOTIEngine(model, fmt, autotune=autotune)
with torch.no_grad():
    seconds = engine.build(128, lambda stage: None)
    ids = list(range(1, 17))
    rates = [generate(engine, ids, 64, eos_ids=()).decode_tokens_per_s for _ in range(2)]
print(json.dumps({"fmt": fmt, "build": seconds, "tokens_per_s": max(rates)}))
"""


def run(quick: bool = False) -> list[Section]:
    if quick:
        sec = Section("Cold build of the compiled engine against its decode speed: not run with --quick", ["run", "why"])
        sec.rows.append(["skipped", "two cold builds take minutes; `llamablock bench build` runs them"])
        return [sec]
    rows = {}
    for autotune in ("on", "off"):
        with tempfile.TemporaryDirectory(prefix="llamablock-bench-build-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            rows[autotune] = run_child(CHILD, autotune, env=env)
    sec = Section(f"Cold build of the compiled engine against its decode speed, SmolLM2-135M-Instruct in "
                  f"{rows['on']['fmt']}; one thread, 64 tokens", ["autotune", "cold build (s)", "decode tok/s"])
    for name, r in rows.items():
        sec.rows.append([name, f"{r['build']:.0f}", f"{r['tokens_per_s']:.1f}"])
    on, off = rows["on"], rows["off"]
    sec.notes.append(f"Autotuning costs {on['build'] - off['build']:.0f} s more to build and decodes "
                     f"{on['tokens_per_s'] / off['tokens_per_s']:.2f}x as fast as inductor's default kernels.")
    return [sec]
