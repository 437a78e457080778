"""What the lab's sections share: the trained runs (one process trains each variant, seed and
recipe once, whichever section asks first), and small helpers more than one section measures with.
Sections import from here, never from each other.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch
import torch.nn.functional as F

from llamablock import norm as norm_lib
from llamablock.config import ModelConfig
from llamablock.kv_cache import KVCache
from llamablock.lab.details_text import said
from llamablock.model import Decoder
from llamablock.studies import ablation
from llamablock.training import data as D
from llamablock.training.train import TrainConfig, get_data, train

QUICK = dict(steps=60, seeds=(0,), size=dict(d_model=64, n_heads=4, n_layers=2), context=64)
FULL = dict(steps=200, seeds=(0, 1, 2), size=None, context=128)
INDICATIVE = said("quick trained", steps=QUICK["steps"], layers=QUICK["size"]["n_layers"], width=QUICK["size"]["d_model"],
                  full_layers=ablation.SIZE["n_layers"], full_width=ablation.SIZE["d_model"], full_steps=FULL["steps"],
                  full_seeds=len(FULL["seeds"]))
NAMES = ("2017", "2017 + RMSNorm", "2017 + RMSNorm pre-LN", "2017 + SwiGLU", "2017 + GELU", "2017 + GQA",
         "2017 + MQA", "2017 + RoPE", "2024")


def lab_variants(vocab: int, context: int, size: dict | None) -> dict:
    """ablation.variants plus 2017 + RMSNorm (post-LN), at the same parameter budget."""
    configs = ablation.variants(vocab, context, size)
    base = configs["2017"]
    configs["2017 + RMSNorm"] = ablation.match_budget(base.replace(norm="rmsnorm"), ablation.count_params(base))
    return configs


_RUNS: dict[tuple, dict] = {}  # one lab process trains each (variant, seed, recipe) once (exp_beyond reuses 2024's)


def run_variants(steps: int, seeds, size, context: int, names=NAMES, lr: float = 1e-3,
                 warmup: float = 0.4) -> list[dict]:
    """One record per (seed, variant), in ablation.run_compare's format (seeds interleaved);
    `warmup` is the warm-up's share of the steps."""
    t = TrainConfig(steps=steps, batch_size=16, context=context, lr=lr, warmup=round(warmup * steps),
                    eval_every=max(1, steps // 5), eval_windows=32)
    configs = {n: c for n, c in lab_variants(get_data(t).tokenizer.vocab_size, context, size).items() if n in names}
    records = []
    for seed in seeds:
        for name, cfg in configs.items():
            key = (name, seed, steps, tuple(sorted((size or {}).items())), context, lr, warmup)
            if key not in _RUNS:
                start = time.perf_counter()
                r = train(cfg, dataclasses.replace(t, seed=seed), None, progress=False)
                windows = D.eval_windows(get_data(t).val, context, t.eval_windows)
                _RUNS[key] = {"variant": name, "seed": seed, "val_loss": r["val_loss"], "tokens_per_s": r["tokens_per_s"],
                              "params": r["params"], "d_ff": cfg.d_ff, "kv_bytes_per_token": cfg.kv_bytes_per_token(2),
                              "seconds": time.perf_counter() - start,
                              "window_losses": window_losses(r["model"], windows).tolist(),
                              "val_curve": [(x["step"], x["val_loss"]) for x in r["history"] if "val_loss" in x]}
                if name == "2017":  # its learned position table and first attention layer (15.1's shift)
                    _RUNS[key]["state"] = {k: v.detach().clone() for k, v in r["model"].state_dict().items()
                                           if k.startswith(("embed.", "positions.", "layers.0.attn."))}
            records.append(_RUNS[key])
    return records


def _row(summary: list[dict], name: str) -> dict:
    return next(r for r in summary if r["variant"] == name)


def _loss(r: dict) -> list:
    """A summary row's loss as the details' {x:loss} takes it: [mean, sd between seeds, seeds]."""
    return [r["val_loss"], r["val_std"], r["seeds"]]


@torch.no_grad()
def window_losses(model: Decoder, windows: torch.Tensor) -> torch.Tensor:
    """(n,) mean next-token loss of each evaluation window, nats."""
    model.eval()
    logits = model(windows[:, :-1])  # (n, t, V)
    return F.cross_entropy(logits.transpose(1, 2).float(), windows[:, 1:], reduction="none").mean(-1)


def window_noise(*terms: tuple[list[dict], str, int]) -> float:
    """Twice the standard error (a two-sided 95% interval) of the mean of a signed sum of per-window
    losses, paired by seed and evaluation window: terms (records, variant, +1 or -1), e.g. a - b, or
    (hot a - calm a) - (hot b - calm b). 0 when the records carry no per-window losses."""
    sums = None
    for records, variant, sign in terms:
        per = [r for r in sorted(records, key=lambda r: r["seed"]) if r["variant"] == variant]
        if not per or any("window_losses" not in r for r in per):
            return 0.0
        losses = [sign * x for r in per for x in r["window_losses"]]
        sums = losses if sums is None else [a + b for a, b in zip(sums, losses, strict=True)]
    return 2 * statistics.stdev(sums) / math.sqrt(len(sums)) if sums and len(sums) > 1 else 0.0


def noise(summaries: list[tuple[list[dict], list[dict], str, int]]) -> tuple[float, dict]:
    """The noise threshold of a comparison of trained results, and how it was derived (a said() entry):
    terms (records, summary, variant, sign). With one seed, the paired window noise (`window_noise`);
    with several, the larger of that and twice the largest standard deviation between seeds of any term."""
    paired = window_noise(*[(records, v, sign) for records, _, v, sign in summaries])
    seeds = min(_row(summary, v)["seeds"] for _, summary, v, _ in summaries)
    if seeds < 2:
        return paired, said("noise one seed")
    spread = 2 * max(_row(summary, v)["val_std"] for _, summary, v, _ in summaries)
    return max(spread, paired), said("noise seeds")


def trained_2017(quick: bool) -> tuple[dict, ModelConfig]:
    """The ablation's 2017 model (learned positions), seed 0, at the quick or full recipe: its
    embeddings, position table and first attention layer, and its config."""
    p = QUICK if quick else FULL
    record = next(r for r in run_variants(p["steps"], (0,), p["size"], p["context"], names=("2017",)))
    t = TrainConfig(context=p["context"])
    return record["state"], lab_variants(get_data(t).tokenizer.vocab_size, p["context"], p["size"])["2017"]


def allocated_bytes(cfg: ModelConfig, tokens: int, dtype: str) -> int:
    """Bytes a KVCache of `tokens` really allocates: one layer allocated, times the layer count (every
    layer's buffers have the same shape), so LLaMA-sized caches are counted without 4 GiB of memory."""
    one_layer = KVCache(cfg.replace(n_layers=1), batch_size=1, max_len=tokens, dtype=getattr(torch, dtype))
    return one_layer.nbytes() * cfg.n_layers


def param_saving(d: int) -> int:
    """LayerNorm's parameters minus RMSNorm's, both counted from the library's layers."""
    def count(kind):
        return sum(p.numel() for p in norm_lib.make_norm(kind, d, 1e-5).parameters())

    return count("layernorm") - count("rmsnorm")
