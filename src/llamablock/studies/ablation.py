"""Section 15.6 measured: the 2017 block, the 2024 block, and each single change between them.

Variants, all config changes of `gpt-2017-small` at the same (small) size:

    2017                   learned positions, post-LN LayerNorm, ReLU 4d, MHA, biases, tied
    2017 + RoPE            position="rope" (the module's neighbouring-pair layout)
    2017 + RMSNorm pre-LN  norm="rmsnorm", norm_placement="pre" (adds the final norm)
    2017 + SwiGLU          ffn="swiglu" at 8/3 width (three matrices instead of two)
    2017 + GQA             n_kv_heads = n_heads / 2 (query heads share kv heads in pairs)
    2024                   `llama-2024-small` at the same size (all four, no biases, untied)

and what came after the module's block (README "Families"), each one change to the 2024 model:

    2024 + q/k norm        RMSNorm over each head's queries and keys before RoPE (Qwen3, Gemma 3)
    2024 + sandwich norms  a second RMSNorm on each sub-layer's output (Gemma 2 and 3)

Equal parameter budget: every variant's feed-forward width d_ff is set so its parameter count
is the closest to the 2017 model's (`match_budget`); so SwiGLU lands near 8/3 d, and GQA and
RoPE spend what they save on a wider feed-forward. Equal compute: same data, same batches
(a batch is a function of seed and step), same steps, same optimizer and schedule.
"""

from __future__ import annotations

import dataclasses
import math
import time

from llamablock.config import ModelConfig
from llamablock.io.empty import empty_decoder
from llamablock.presets import preset
from llamablock.training.train import TrainConfig, train
from llamablock.util.plots import figure, save_png

SIZE = dict(d_model=128, n_heads=4, n_layers=4)  # ~0.8M parameters


def count_params(cfg: ModelConfig) -> int:
    return empty_decoder(cfg).num_parameters()


def match_budget(cfg: ModelConfig, target: int) -> ModelConfig:
    """The same config with d_ff chosen so the parameter count is closest to `target`
    (the count is linear in d_ff, so two evaluations give the slope)."""
    p1, p2 = count_params(cfg.replace(d_ff=64)), count_params(cfg.replace(d_ff=128))
    per_unit = (p2 - p1) / 64
    d_ff = max(1, round(64 + (target - p1) / per_unit))
    return cfg.replace(d_ff=d_ff)


def variants(vocab_size: int, context: int, size: dict | None = None) -> dict[str, ModelConfig]:
    size = {**SIZE, **(size or {})}
    base = preset("gpt-2017-small", vocab_size=vocab_size, max_seq_len=context, d_ff=4 * size["d_model"],
                  n_kv_heads=size["n_heads"], **size)
    h = size["n_heads"]
    if h % 2:
        raise ValueError(f"the GQA variant shares kv heads in pairs: n_heads must be even, got {h}")
    new = preset("llama-2024-small", vocab_size=vocab_size, max_seq_len=context, n_kv_heads=h // 2, **size)
    configs = {
        "2017": base,
        "2017 + RoPE": base.replace(position="rope", rope_layout="interleaved"),
        "2017 + RMSNorm pre-LN": base.replace(norm="rmsnorm", norm_placement="pre"),
        "2017 + SwiGLU": base.replace(ffn="swiglu"),
        "2017 + GQA": base.replace(n_kv_heads=h // 2),
        "2024": new,
        # Two more single changes the module mentions, run on request (the lab asks for them):
        "2017 + GELU": base.replace(ffn="gelu"),  # Shazeer compares SwiGLU with ReLU *and* GELU
        "2017 + MQA": base.replace(n_kv_heads=1),  # Ainslie et al.: GQA sits between MHA and MQA
        "2024 + q/k norm": new.replace(qk_norm=True),
        "2024 + sandwich norms": new.replace(sandwich_norm=True),
    }
    target = count_params(base)
    return {name: (cfg if name == "2017" else match_budget(cfg, target)) for name, cfg in configs.items()}


# What `llamablock compare` trains unless told otherwise: the 2017 and 2024 models, the four
# single changes of the module's table, and the two changes its descendants made to the 2024 block.
DEFAULT_VARIANTS = ("2017", "2017 + RoPE", "2017 + RMSNorm pre-LN", "2017 + SwiGLU", "2017 + GQA", "2024",
                    "2024 + q/k norm", "2024 + sandwich norms")


def run_compare(steps: int = 200, seeds: tuple[int, ...] = (0, 1, 2), size: dict | None = None,
                context: int = 128, batch_size: int = 16, lr: float = 1e-3, warmup: int | None = None,
                names: list[str] | None = None, progress: bool = False, log=None) -> list[dict]:
    """Train every variant for every seed; one record per run. Runs are interleaved (all variants
    of seed 0, then seed 1, ...) so a change in machine load does not favour one variant.
    `log(line)` is called after each run (the command passes print with flush)."""
    from llamablock.training.train import get_data

    warmup = round(0.4 * steps) if warmup is None else warmup
    t = TrainConfig(steps=steps, batch_size=batch_size, context=context, lr=lr, warmup=warmup,
                    eval_every=max(1, steps // 5), eval_windows=32)
    vocab = get_data(t).tokenizer.vocab_size
    configs = variants(vocab, context, size)
    unknown = sorted(set(names or []) - set(configs))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; variants are {list(configs)}")
    records = []
    for seed in seeds:
        for name, cfg in configs.items():
            if name not in (names or DEFAULT_VARIANTS):
                continue
            start = time.perf_counter()
            r = train(cfg, dataclasses.replace(t, seed=seed), None, progress=progress)
            rec = {"variant": name, "seed": seed, "val_loss": r["val_loss"], "tokens_per_s": r["tokens_per_s"],
                   "params": r["params"], "d_ff": cfg.d_ff, "kv_bytes_per_token": cfg.kv_bytes_per_token(2),
                   "train_loss": r["history"][-1]["train_loss"], "seconds": time.perf_counter() - start,
                   "val_curve": [(x["step"], x["val_loss"]) for x in r["history"] if "val_loss" in x],
                   "config": cfg.to_dict()}
            records.append(rec)
            if log:
                log(f"  seed {seed}  {name:<24} val {rec['val_loss']:.4f}  {rec['tokens_per_s']:,.0f} tok/s  "
                    f"{rec['seconds']:.0f} s")
    return records


def summarize(records: list[dict]) -> list[dict]:
    rows = {}
    for r in records:
        rows.setdefault(r["variant"], []).append(r)
    out = []
    for name, rs in rows.items():
        vals = [r["val_loss"] for r in rs]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        out.append({"variant": name, "seeds": len(rs), "val_loss": mean, "val_std": std,
                    "tokens_per_s": sum(r["tokens_per_s"] for r in rs) / len(rs), "params": rs[0]["params"],
                    "d_ff": rs[0]["d_ff"], "kv_bytes_per_token": rs[0]["kv_bytes_per_token"]})
    base = next((r for r in out if r["variant"] == "2017"), None)
    for r in out:
        r["delta_vs_2017"] = r["val_loss"] - base["val_loss"] if base else None
        r["speed_vs_2017"] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
    return out


def format_table(summary: list[dict]) -> str:
    head = (f"{'variant':<24}{'params':>10}{'d_ff':>6}{'KV B/tok':>10}{'val loss':>10}{'± sd':>8}"
            f"{'vs 2017':>9}{'tokens/s':>10}{'x 2017':>8}")
    lines = [head, "-" * len(head)]
    for r in summary:
        delta = "" if r["delta_vs_2017"] is None else f"{r['delta_vs_2017']:+.3f}"
        speed = "" if r["speed_vs_2017"] is None else f"{r['speed_vs_2017']:.2f}"
        lines.append(f"{r['variant']:<24}{r['params']:>10,}{r['d_ff']:>6}{r['kv_bytes_per_token']:>10,}"
                     f"{r['val_loss']:>10.4f}{r['val_std']:>8.4f}{delta:>9}{r['tokens_per_s']:>10,.0f}{speed:>8}")
    lines.append("val loss: nats/character on the fixed validation split, mean over seeds (sd between seeds); "
                 "KV bytes per token at fp16; tokens/s: training throughput on this machine")
    return "\n".join(lines)


def plot_compare(records: list[dict], summary: list[dict], path) -> None:
    """Validation curves (mean over the seeds run) and final losses with their seed spread."""
    fig, (a, b) = figure(12, 4.5, ncols=2, dpi=100)
    seeds = max(r["seeds"] for r in summary)
    for row in summary:
        curves = [r["val_curve"] for r in records if r["variant"] == row["variant"]]
        steps = [s for s, _ in curves[0]]
        a.plot(steps, [sum(c[i][1] for c in curves) / len(curves) for i in range(len(steps))], "o-", ms=3,
               label=row["variant"])
    a.set(xlabel="step", ylabel="validation loss (nats/char)",
          title=f"mean over {seeds} seeds" if seeds > 1 else "one seed")
    a.legend(fontsize=7)
    names = [r["variant"] for r in summary]
    b.bar(range(len(names)), [r["val_loss"] for r in summary],
          yerr=[r["val_std"] for r in summary] if seeds > 1 else None, capsize=4)
    lo = min(r["val_loss"] - r["val_std"] for r in summary)
    hi = max(r["val_loss"] + r["val_std"] for r in summary)
    pad = 0.25 * (hi - lo + 1e-3)
    b.set_ylim(lo - pad, hi + pad)  # a zoomed axis: the title says so
    b.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    b.set(ylabel="final validation loss",
          title="equal parameters, equal steps\n(axis zoomed; bars: ± 1 sd)" if seeds > 1 else
          "equal parameters, equal steps\n(axis zoomed; one seed, no spread)")  # two lines: one is clipped at 6 in
    save_png(fig, path)
