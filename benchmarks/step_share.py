"""A decode step's bandwidth share, side by side with a plain read of the bytes it streams.

The target (`bench size`'s claim): at 1B the step streams its weights at >= 85% of a plain read
of the same bytes on the same threads. This host's read rate drifts within minutes, and a fresh
process's decode rate and a read taken a few seconds away from it can fall in different phases. So here, in
one process, each of `pairs` steps comes straight after a plain read of the step's bytes
(benchmarks/read_ceiling.py's C read), and the share is the median of read time / step time over
the pairs. `bench size` runs it in a child process per engine, with the same cache as its
`generate` runs, so the engine is the one the plain command builds (`step_share` "auto": the
compiled one where `llamablock compile` has built it; "eager": the eager one).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

# In a child process of `bench size`: python -c CHILD path engine threads pairs; prints the JSON.
CHILD = ("import json, sys, torch\ntorch.set_num_threads(int(sys.argv[3]))\n"
         "from benchmarks.step_share import step_share\n"
         "print(json.dumps(step_share(sys.argv[1], sys.argv[2], int(sys.argv[4]))))")


def step_bytes(path: Path) -> tuple[int, object]:
    """(bytes a decode step reads: every tensor but an untied embedding, the model's config)."""
    import gguf

    from llamablock.io.source import open_source

    cfg = open_source(path, tokenizer=False).cfg
    tensors = gguf.GGUFReader(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(int(t.n_bytes) for t in tensors if tied or t.name != "token_embd.weight"), cfg


def step_share(path: str | Path, engine: str = "eager", pairs: int = 16) -> dict:
    """{'share': median of read time / step time, 'low', 'high': the pairs' extremes, 'engine': which
    ran}: `pairs` decode steps of the plain command's engine for `path` (plan.decide's `engine`
    choice), each after a plain read of the bytes a step streams, on torch's threads."""
    from benchmarks.read_ceiling import _library
    from llamablock.fast.plan import build, decide
    from llamablock.io.source import open_source
    from llamablock.util.denormals import flushed_denormals

    lib = _library()
    if lib is None:
        raise RuntimeError("no C compiler for the plain read; the step's share is not measured")
    nbytes, _ = step_bytes(Path(path))
    source = open_source(path, tokenizer=False)
    built = build(source, decide(source, "auto", engine)).engine
    words, threads = torch.ones(nbytes // 8, dtype=torch.int64), torch.get_num_threads()
    ids = torch.randint(0, source.cfg.vocab_size, (1, 4), generator=torch.Generator().manual_seed(0))
    ratios = []
    with torch.inference_mode(), flushed_denormals():
        built.prepare(4 + pairs + 4)
        built.prefill(ids)
        for pos in range(4, 4 + pairs + 2):
            t0 = time.perf_counter()
            lib.read_all(words.data_ptr(), words.numel(), threads)
            t1 = time.perf_counter()
            built.step(ids[:, :1], pos)
            if pos >= 6:  # two steps first: the engine's first calls load and allocate
                ratios.append((t1 - t0) / (time.perf_counter() - t1))
    return {"share": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
            "engine": built.describe()}
