"""Passkey retrieval: can a method find a number hidden far back (Mohtashami and Jaggi 2023, the test
LongLoRA and YaRN report)? A five-digit key is hidden at a depth (10%, 50%, 90% of the filler) in
repeated filler text of a given length; the model is asked for it and answers greedily; the answer
is right when the key appears in the first new tokens.

Lengths inside the trained context L are the control: a model that cannot find the key in its
own window cannot show what a method does past it, and the result then says "not measurable on
this model" instead of ranking the methods. Prompts and filler are the passkey paper's.
Generation: the RoPE methods prefill once and decode with a KV cache; Self-Extend and sinks (whose
attention takes no cache here) run the whole prompt again for each new token.
"""

from __future__ import annotations

import random

import torch

from llamablock.kv_cache import KVCache
from llamablock.studies.context_extension import ROPE_METHODS, method_model

TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
DEPTHS = (0.1, 0.5, 0.9)
NEW_TOKENS = 8  # a five-digit key is at most five tokens, with room for a space or a quote first
CONTROL_PASS = 0.5  # accuracy inside L below which the task is "not measurable" on the model


def passkey_text(tok, length: int, depth: float, key: int) -> str:
    """The prompt as text, about `length` tokens once encoded by `tok` (never more): the task, filler
    with the key at `depth`, the question. Text, so that a command given it as --prompt reads the
    same token ids that passkey_prompt gives."""
    needle = f" The pass key is {key}. Remember it. {key} is the pass key."

    def text(k: int) -> str:
        cut = round(k * depth)
        return " ".join([TASK] + [FILLER] * cut) + needle + " " + " ".join([FILLER] * (k - cut) + [QUESTION])

    bare = len(tok.encode(text(0)))
    if bare > length:
        raise ValueError(f"a passkey prompt needs more than {length} tokens with this tokenizer "
                         f"({bare} without filler); ask for longer lengths")
    per = max(1, len(tok.encode(" " + FILLER)))
    k = max(0, (length - bare) // per)
    while k > 0 and len(tok.encode(text(k))) > length:  # the estimate may overshoot by a merge or two
        k -= 1
    return text(k)


def passkey_prompt(tok, length: int, depth: float, key: int) -> list[int]:
    """About `length` token ids (never more): passkey_text encoded."""
    return tok.encode(passkey_text(tok, length, depth, key))


@torch.no_grad()
def greedy(model, ids: list[int], new: int, cached: bool) -> list[int]:
    x = torch.tensor([ids])  # (1, n)
    out = []
    if cached:
        cache = KVCache(model.cfg, batch_size=1, max_len=len(ids) + new)
        h = model.hidden(x, cache=cache)[:, -1]
        for _ in range(new):
            nxt = int(model.logits(h).argmax(-1))
            out.append(nxt)
            h = model.hidden(torch.tensor([[nxt]]), cache=cache)[:, -1]
        return out
    for _ in range(new):
        nxt = int(model.logits(model.hidden(x)[:, -1]).argmax(-1))
        out.append(nxt)
        x = torch.cat((x, torch.tensor([[nxt]])), dim=1)
    return out


def run_passkey(model, tok, methods: list[str], lengths: list[int], factor: float, trials: int = 2,
                seed: int = 0, progress: bool = False) -> dict:
    """{"lengths", "depths", "trials", "methods": {method: {length: accuracy}}, "control", "verdict"}.
    The same keys and prompts for every method (drawn from `seed`)."""
    from tqdm import tqdm

    rng = random.Random(seed)
    L = model.cfg.max_seq_len
    prompts = {n: [(d, key, passkey_prompt(tok, n, d, key)) for d in DEPTHS
                   for key in [rng.randrange(10000, 100000) for _ in range(trials)]] for n in lengths}
    acc = {m: {} for m in methods}
    bar = tqdm(total=len(methods) * sum(len(p) for p in prompts.values()), disable=not progress, desc="passkey")
    for m in methods:
        for n, cases in prompts.items():
            mm = method_model(model, m, factor, n + NEW_TOKENS)
            right = 0
            for _, key, ids in cases:
                right += str(key) in tok.decode(greedy(mm, ids, NEW_TOKENS, cached=m in ROPE_METHODS))
                bar.update(1)
            acc[m][str(n)] = right / len(cases)
    bar.close()
    inside = [n for n in lengths if n <= L]
    control = {str(n): acc["none"][str(n)] for n in inside} if "none" in acc else {}
    if not control:
        verdict = "no control: include method none and a length inside the trained context"
    elif min(control.values()) < CONTROL_PASS:
        verdict = (f"not measurable on this model: it finds the key in fewer than {CONTROL_PASS:.0%} of the trials "
                   "inside its own trained context")
    else:
        verdict = "measurable: the model finds the key inside its trained context"
    return {"lengths": lengths, "depths": list(DEPTHS), "trials": trials, "methods": acc, "control": control,
            "verdict": verdict}
