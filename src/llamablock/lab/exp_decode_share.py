"""15.5: "every generated token must read the whole KV cache, which grows with h_kv and takes much of
each step's time", timed on one layer of LLaMA 3 8B's shapes at the module's context lengths.

One decode step of one layer is split into what reads the weights (the q/k/v/o projections and the
SwiGLU layer applied to one token) and what reads the cache (attention of the token's 32 query
heads over the cached keys and values), each timed with the library's own layers on one thread,
float32, interleaved over rounds (lab.timed). The cache's share of the step is cache / (cache +
weights) per round, beside its share of the bytes the step reads. 'Much' has no figure in the
module: it is read here as at least a tenth of the step at 32 KV heads (MHA, the layout the
sentence is about) and the module's 8,192 tokens, the lower end of the 95% interval of the median
share; 'grows with h_kv' as a larger share at 32 KV heads than at 8, and (full run) at 32,768
tokens than at 8,192, each on the interval of the median per-round difference.
"""

from __future__ import annotations

import statistics

import torch

from llamablock.attention import Attention, AttentionInputs
from llamablock.ffn import make_ffn
from llamablock.lab.details_text import said
from llamablock.lab.record import Claim
from llamablock.lab.timed import median_interval, one_thread, rounds
from llamablock.presets import preset

CLAIMS = ("15.5.decode-share",)
MUCH = 0.1  # 'much of each step's time', read as at least a tenth
KV = (32, 8)  # MHA and LLaMA 3 8B's GQA


def _layer(kv: int):
    """(weights part, attention module) of one LLaMA 3 8B layer with `kv` KV heads."""
    cfg = preset("llama-3-8b").replace(n_layers=1, n_kv_heads=kv)
    attn, ffn = Attention(cfg), make_ffn(cfg)
    x = torch.randn(1, 1, cfg.d_model)

    def weights():  # one token through every matrix of the layer
        attn.wq(x), attn.wk(x), attn.wv(x), attn.wo(x), ffn(x)

    nbytes = sum(p.nbytes for m in (attn, ffn) for p in m.parameters())
    return weights, attn, nbytes


def measure(quick: bool) -> dict:
    tokens = (8192,) if quick else (8192, 32768)
    fns, nbytes = {}, {}
    with torch.no_grad(), one_thread():
        for kv in KV:
            weights, attn, nbytes[f"weights-{kv}"] = _layer(kv)
            fns[f"weights-{kv}"] = weights
            q = torch.randn(1, 32, 1, 128)
            for n in tokens:
                k, v = torch.randn(1, kv, n, 128), torch.randn(1, kv, n, 128)
                fns[f"cache-{kv}-{n}"] = (lambda a=attn, q=q, k=k, v=v: a.attend(q, k, v, AttentionInputs()))
                nbytes[f"cache-{kv}-{n}"] = k.nbytes + v.nbytes
        samples = rounds(fns, repeats=5 if quick else 15, warmup=1)
    shares = {(kv, n): [c / (c + w) for c, w in zip(samples[f"cache-{kv}-{n}"], samples[f"weights-{kv}"], strict=True)]
              for kv in KV for n in tokens}
    return {"tokens": tokens, "shares": shares, "nbytes": nbytes,
            "ms": {name: statistics.median(s) * 1e3 for name, s in samples.items()}}


def _interval(values: list[float]) -> tuple[float, float, float]:
    return (statistics.median(values), *median_interval(values))


def judge(m: dict) -> Claim:
    c = Claim("15.5.decode-share", "15.5", "reading the KV cache takes much of each decode step's time, and grows "
              "with h_kv", "much; grows", unit="cache's share of one layer's decode step, LLaMA 3 8B shapes, one "
              "thread, median over rounds",
              tolerance=f"at 32 KV heads and 8,192 tokens the median share's 95% interval at least {MUCH:g}; the share "
                        "larger at 32 KV heads than at 8 (and at 32,768 tokens than at 8,192), on the interval of "
                        "the median per-round difference")
    tokens, shares, nbytes = m["tokens"], m["shares"], m["nbytes"]
    mha = _interval(shares[(32, 8192)])
    grows = {"heads": _interval([a - b for a, b in zip(shares[(32, 8192)], shares[(8, 8192)], strict=True)])}
    if 32768 in tokens:
        grows["tokens"] = _interval([a - b for a, b in zip(shares[(32, 32768)], shares[(32, 8192)],
                                                                            strict=True)])
    c.measured = {f"{kv} KV, {n:,}": round(statistics.median(s), 3) for (kv, n), s in shares.items()}
    c.table = [{"KV heads": kv, "tokens": n, "cache ms": m["ms"][f"cache-{kv}-{n}"], "weights ms": m["ms"][f"weights-{kv}"],
                "time share": statistics.median(s),
                "bytes share": nbytes[f"cache-{kv}-{n}"] / (nbytes[f"cache-{kv}-{n}"] + nbytes[f"weights-{kv}"])}
               for (kv, n), s in shares.items()]
    much = mha[1] >= MUCH
    rising = all(g[1] > 0 for g in grows.values())
    details = [said("15.5.decode-share", rounds=len(shares[(32, 8192)]), share=mha[0], low=mha[1], high=mha[2])]
    details.append(said("15.5.decode-share heads", diff=grows["heads"][0], low=grows["heads"][1], high=grows["heads"][2]))
    if "tokens" in grows:
        details.append(said("15.5.decode-share tokens", diff=grows["tokens"][0], low=grows["tokens"][1],
                            high=grows["tokens"][2]))
    details.append(said("15.5.decode-share bytes"))
    if not much:
        details.append(said("15.5.decode-share not much", much=MUCH))
    if not rising:
        details.append(said("15.5.decode-share not rising"))
    return c.judge(much and rising, *details)


def run(quick: bool, out) -> list[Claim]:
    c = judge(measure(quick))
    if quick:
        c.indicative = [said("15.5.decode-share quick", rounds=5, full_rounds=15)]
    return [c]
