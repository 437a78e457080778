"""The compiled decode step with its weights in 2 MiB pages against 4 KiB pages (llamablock.huge_pages).

Two CompiledDecoder engines per format, built from the same model: the first compiles the
AOTInductor package (or loads it from the cache), the second loads the same package, so both run
the same library; only `huge_pages` differs (the library's copy of the weights moved into 2 MiB
pages, or left in the 4 KiB pages it was loaded into). Both prefill the same prompt, then decode
blocks of `steps` greedy steps from the same position, the two engines alternating block by
block (llamablock.lab.timing.time_calls); the logits of one step are checked equal first.
Full: SmolLM2-135M in float32, bfloat16, q8 and q4, autotuned as `generate --compile`.
--quick: a random one-layer model with a 16,384-token vocabulary (16 MiB of float32 weights),
no autotuning.
"""

from __future__ import annotations

import copy

import torch

from benchmarks.common import Section
from llamablock.lab.timing import time_calls

NAME = "huge_pages"
CLAIM = "the compiled step's weights in 2 MiB pages: decode tokens/s against 4 KiB pages"


def _models(quick: bool) -> dict:
    """format -> the float model its engine is built from."""
    if quick:
        from llamablock.config import ModelConfig
        from llamablock.model import Decoder

        cfg = ModelConfig(vocab_size=16384, d_model=128, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=256)
        return {"float32": Decoder(cfg).eval()}
    import llamablock

    base = llamablock.load_pretrained(None).eval()
    bf16 = copy.deepcopy(base).to(torch.bfloat16)
    return {"float32": base, "bfloat16": bf16, "q8": bf16, "q4": bf16}


@torch.no_grad()
def _pair(model, fmt: str, quick: bool, prompt: int, steps: int, repeats: int) -> list[str]:
    from llamablock.compiled_decode import CompiledDecoder

    engines = {}
    for huge in (False, True):
        engine = CompiledDecoder(model, fmt, autotune=not quick, compile_prefill=not quick, huge_pages=huge)
        engine.warm_up(prompt + steps + 1)
        engines[huge] = engine
    ids = torch.randint(0, model.cfg.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
    token = torch.tensor([[1]])
    logits = [e.prefill(ids) for e in engines.values()] + [e.step(token, prompt) for e in engines.values()]
    if not (torch.equal(logits[0], logits[1]) and torch.equal(logits[2], logits[3])):
        raise AssertionError(f"{fmt}: the same library gave other logits with its weights in huge pages")

    def block(engine):
        return lambda: [engine.step(token, prompt + i) for i in range(steps)]

    t = time_calls({"4 KiB": block(engines[False]), "2 MiB": block(engines[True])}, repeats=repeats, warmup=1)
    small, huge = (steps / t[k]["median"] for k in ("4 KiB", "2 MiB"))
    moved = engines[True]._step.huge_page_bytes
    return [fmt, f"{moved / 2**20:.0f}", f"{small:.1f}", f"{huge:.1f}", f"{huge / small:.2f}x"]


def run(quick: bool = False) -> list[Section]:
    prompt, steps, repeats = (16, 8, 3) if quick else (64, 32, 8)
    what = "a random 1-layer model (16 MiB), float32" if quick else "SmolLM2-135M"
    sec = Section(f"Compiled decode step, {what}: weights in 4 KiB pages against 2 MiB pages "
                  f"(blocks of {steps} steps, medians of {repeats}, alternating)",
                  ["format", "MiB moved into 2 MiB pages", "tokens/s, 4 KiB pages", "tokens/s, 2 MiB pages", "ratio"])
    for fmt, model in _models(quick).items():
        sec.rows.append(_pair(model, fmt, quick, prompt, steps, repeats))
    sec.notes.append("Both engines run one AOTInductor library (the second loads the package the first compiled "
                     "or found); the logits of a prefill and a step are equal bit for bit. 'MiB moved' is what "
                     "the kernel moved into 2 MiB pages (MADV_COLLAPSE); 0 means it refused, and the two then "
                     "differ by noise only. The two alternate in one process, so each reads its weights after "
                     "the other has evicted them from the caches, as in the decode table's rounds.")
    return [sec]
