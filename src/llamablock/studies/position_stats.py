"""Per-token losses by position, summed up across documents: bins, perplexity by range, and each
method's difference from the reference with a 95% interval.

Loss i (predicting token i + 1) sits at position i, made with i + 1 tokens of context. A bin
[start, end) holds positions start..end-1; "inside L" holds predictions made with at most L
tokens (positions 0..L-1), "L to 2L" with L+1..2L tokens, "beyond 2L" with more.
The document is the unit: a bin's loss is the mean over documents of each document's mean loss
there, and the interval of a difference is Student's t over the documents' differences
(mean +- t(0.975, k - 1) sd / sqrt(k)); one document gives no interval (None).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch


@lru_cache(maxsize=None)  # one value per number of documents, asked for in every bin
def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom: the CDF inverted by
    bisection, the CDF integrated from the density with Simpson's rule on [0, x] (the density is
    smooth; 2,000 intervals put the quantile within 1e-6 of the closed forms tested)."""
    if df < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {df}")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf_above_half(x: float, n: int = 2000) -> float:  # integral of the density over [0, x]
        h = x / n
        f = [c * (1 + (h * k) ** 2 / df) ** (-(df + 1) / 2) for k in range(n + 1)]
        return h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 1.0
    while cdf_above_half(hi) < 0.475:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf_above_half(mid) < 0.475 else (lo, mid)
    return (lo + hi) / 2


def interval(values: list[float]) -> tuple[float, float | None, float | None]:
    """(mean, low, high) of a 95% t interval over `values` (one per document)."""
    k = len(values)
    mean = sum(values) / k
    if k < 2:
        return mean, None, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    half = t_quantile_975(k - 1) * sd / math.sqrt(k)
    return mean, mean - half, mean + half


def bin_edges(n_losses: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, n_losses)) for a in range(0, n_losses, size)]


def ranges(n_losses: int, trained: int) -> dict[str, tuple[int, int]]:
    """The perplexity ranges that hold any loss: inside L, L to 2L, beyond 2L (module docstring)."""
    spans = {"inside_L": (0, trained), "L_to_2L": (trained, 2 * trained), "beyond_2L": (2 * trained, n_losses)}
    return {name: (a, min(b, n_losses)) for name, (a, b) in spans.items() if a < min(b, n_losses)}


def summarize(losses: dict[str, list[torch.Tensor]], trained: int, bin_size: int,
              reference: str = "reference") -> dict[str, dict]:
    """{method: {"bins": [...], "perplexity": {...}}} from each method's per-document losses
    (all of one length). Each bin's `nll` comes with its 95% interval across documents (`nll_low`,
    `nll_high`); every method but the reference also carries `delta`, `delta_low` and `delta_high`
    per bin, and `delta` per range: the mean difference in nats from the reference and its interval."""
    n = {t.shape[0] for docs in losses.values() for t in docs}
    if len(n) != 1:
        raise ValueError(f"every document and method must have the same number of losses, got {sorted(n)}")
    n = n.pop()
    ref = losses.get(reference)
    out = {}
    for method, docs in losses.items():
        bins = []
        for a, b in bin_edges(n, bin_size):
            means = [float(d[a:b].double().mean()) for d in docs]
            mean, low, high = interval(means)
            row = {"start": a, "end": b, "nll": mean, "nll_low": low, "nll_high": high}
            if ref is not None and method != reference:
                diffs = [m - float(r[a:b].double().mean()) for m, r in zip(means, ref, strict=True)]
                row["delta"], row["delta_low"], row["delta_high"] = interval(diffs)
            bins.append(row)
        spans = ranges(n, trained)
        ppl = {name: math.exp(sum(float(d[a:b].double().mean()) for d in docs) / len(docs))
               for name, (a, b) in spans.items()}
        out[method] = {"bins": bins, "perplexity": ppl}
        if ref is not None and method != reference:
            out[method]["delta"] = {
                name: dict(zip(("mean", "low", "high"), interval(
                    [float(d[a:b].double().mean() - r[a:b].double().mean()) for d, r in zip(docs, ref, strict=True)]), strict=True))
                for name, (a, b) in spans.items()}
    return out
