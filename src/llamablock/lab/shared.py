"""What the lab's sections share: the trained runs (one process trains each variant, seed and
recipe once, whichever section asks first), and small helpers more than one section measures with.
Sections import from here, never from each other.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from llamablock import norm as norm_lib
from llamablock.config import ModelConfig
from llamablock.kv_cache import KVCache
from llamablock.studies import ablation
from llamablock.training.train import TrainConfig, get_data, train

QUICK = dict(steps=60, seeds=(0,), size=dict(d_model=64, n_heads=4, n_layers=2), context=64)
FULL = dict(steps=200, seeds=(0, 1, 2), size=None, context=128)
INDICATIVE = ("quick run: one seed, 60 steps of a 2-layer width-64 model; `llamablock lab` trains 4 layers of width "
              "128 for 200 steps with three seeds")
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
                _RUNS[key] = {"variant": name, "seed": seed, "val_loss": r["val_loss"], "tokens_per_s": r["tokens_per_s"],
                              "params": r["params"], "d_ff": cfg.d_ff, "kv_bytes_per_token": cfg.kv_bytes_per_token(2),
                              "seconds": time.perf_counter() - start,
                              "val_curve": [(x["step"], x["val_loss"]) for x in r["history"] if "val_loss" in x]}
                if name == "2017":  # its learned position table and first attention layer (15.1's shift)
                    _RUNS[key]["state"] = {k: v.detach().clone() for k, v in r["model"].state_dict().items()
                                           if k.startswith(("embed.", "positions.", "layers.0.attn."))}
            records.append(_RUNS[key])
    return records


def _row(summary: list[dict], name: str) -> dict:
    return next(r for r in summary if r["variant"] == name)


def _loss(r: dict) -> str:
    return f"{r['val_loss']:.4f} ± {r['val_std']:.4f} (sd, {r['seeds']} seeds)" if r["seeds"] > 1 else \
        f"{r['val_loss']:.4f} (one seed)"




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
