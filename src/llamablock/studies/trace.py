"""The token tracer of section 15.6: one input through a trained 2017 and 2024 model, stage by stage.

Stages: embeddings, + positions (2017 only: the 2024 model rotates q and k inside attention),
each block after attention and after the feed-forward, the final norm (pre-LN only: post-LN
already ends every block with a norm), and the logits. For each stage and token: RMS, mean and
variance of the residual stream over its d_model features (population variance, as LayerNorm
computes it). For post-LN stages we also report the LayerNorm's output *before* its affine
scale and shift, (h - mean) / sqrt(var + eps): that is the value the module says is "reset to
mean 0 and variance 1", while the stream itself carries the learned gamma and beta.

Stages are read with forward hooks on the model's own modules (so model.py holds no tracing code,
and the logits are the model's own): pre-LN's stream after attention is the input of norm2, after the
feed-forward it is the block's output; post-LN's are the outputs of norm1 and norm2.

`trace_pair(text, cache_dir=None)` trains the pair on first use (`TRACE_RECIPE`; that first
trace therefore takes a while) and caches the checkpoints under ~/.cache/llamablock/trace-v1,
so later traces only run the two models.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from llamablock.norm import rms_normalize
from llamablock.presets import ARCH_PRESETS
from llamablock.training.train import TrainConfig, load_trained, train
from llamablock.util.files import replace_dir, user_cache_dir
from llamablock.util.plots import figure, save_png

PAIR = ARCH_PRESETS  # the two models traced side by side
# Trained on first use: 150 steps of 16 x 128 characters each model.
TRACE_RECIPE = TrainConfig(steps=150, batch_size=16, context=128, lr=1e-3, warmup=60, eval_every=75,
                           eval_windows=32, seed=0)
CACHE_VERSION = "trace-v1"  # bump when TRACE_RECIPE changes so old checkpoints are not reused


def _stats(x: torch.Tensor) -> dict:
    """x (t, D) -> per-token lists of rms, mean, var over the feature axis."""
    x = x.double()
    return {"rms": x.pow(2).mean(-1).sqrt().tolist(), "mean": x.mean(-1).tolist(),
            "var": x.var(-1, unbiased=False).tolist()}


def _normalized(h: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """The norm's output before its learned scale (and shift): what LayerNorm/RMSNorm divide out."""
    if isinstance(norm, torch.nn.LayerNorm):
        return F.layer_norm(h.float(), norm.normalized_shape, eps=norm.eps)
    return rms_normalize(h, norm.eps)


@torch.no_grad()
def trace_model(model, tokenizer, text: str, top_k: int = 5) -> dict:
    """Stages of one model on `text` (batch of one). Returns per-token stats for every stage."""
    if not text:
        raise ValueError("--text is empty: give at least one character to trace")
    ids = torch.tensor([tokenizer.encode(text)])
    if ids.shape[1] > model.cfg.max_seq_len:
        raise ValueError(f"text is {ids.shape[1]} tokens, longer than the model's {model.cfg.max_seq_len} positions")
    seen: dict[str, torch.Tensor] = {}
    hooks = []

    def keep(name, which="out"):
        def hook(module, inputs, output):
            seen[name] = (inputs[0] if which == "in" else output)[0].detach()
        return hook

    hooks.append(model.embed.register_forward_hook(keep("embeddings")))
    hooks.append(model.layers[0].register_forward_pre_hook(lambda m, a: seen.__setitem__("stream_in", a[0][0])))
    post = model.cfg.norm_placement == "post"
    for i, layer in enumerate(model.layers):
        if post:
            hooks.append(layer.norm1.register_forward_hook(keep(f"{i}.attn")))
            hooks.append(layer.norm1.register_forward_hook(keep(f"{i}.attn_sum", "in")))
            hooks.append(layer.norm2.register_forward_hook(keep(f"{i}.ffn_sum", "in")))
        else:
            hooks.append(layer.norm2.register_forward_hook(keep(f"{i}.attn", "in")))
        hooks.append(layer.register_forward_hook(keep(f"{i}.ffn")))
    hooks.append(model.final_norm.register_forward_hook(keep("final_norm")))
    try:
        logits = model(ids)[0]  # (t, V)
    finally:
        for h in hooks:
            h.remove()

    stages = [{"name": "embeddings", **_stats(seen["embeddings"])}]
    if model.positions is not None:
        stages.append({"name": "+ positions", **_stats(seen["stream_in"])})
    for i, layer in enumerate(model.layers):
        for part, norm in (("attn", layer.norm1), ("ffn", layer.norm2)):
            stage = {"name": f"block {i + 1} after {'attention' if part == 'attn' else 'feed-forward'}",
                     **_stats(seen[f"{i}.{part}"])}
            if post:
                stage["normalized"] = _stats(_normalized(seen[f"{i}.{part}_sum"], norm))
            stages.append(stage)
    if not post:
        stages.append({"name": "final norm", **_stats(seen["final_norm"])})
    stages.append({"name": "logits", **_stats(logits)})
    probs = torch.softmax(logits[-1].float(), -1)
    top = torch.topk(probs, min(top_k, probs.numel()))
    return {"tokens": [tokenizer.decode([i]) for i in ids[0].tolist()], "stages": stages,
            "top": [{"token": tokenizer.decode([i]), "prob": float(p)} for p, i in zip(top.values, top.indices, strict=True)],
            "logits": logits}


def default_cache_dir() -> Path:
    return user_cache_dir()


def models_dir(cache_dir: str | Path | None = None) -> Path:
    """The directory that holds the traced pair's runs (`llamablock cache` reports and clears it)."""
    return Path(cache_dir or default_cache_dir()) / CACHE_VERSION


def pair_dirs(cache_dir: str | Path | None = None) -> dict[str, Path]:
    """arch -> the run directory its traced model is (or will be) cached in."""
    root = models_dir(cache_dir)
    return {arch: root / name for arch, name in PAIR.items()}


def is_trained(run: Path) -> bool:
    return (run / "checkpoints" / "latest").is_file()


def ensure_pair(cache_dir: str | Path | None = None, progress: bool = False,
                recipe: TrainConfig = TRACE_RECIPE) -> dict[str, Path]:
    """Run directories of the trained pair, training any that are missing (written to a temporary
    folder and renamed into place, so a half-trained model is never picked up)."""
    from llamablock.presets import preset

    runs = pair_dirs(cache_dir)
    for arch, run in runs.items():
        name, root = run.name, run.parent
        root.mkdir(parents=True, exist_ok=True)
        if not is_trained(run):
            tmp = root / f".tmp-{name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            if progress:
                print(f"training the {arch} model ({name}) for the tracer, {recipe.steps} steps; cached in {run}")
            train(preset(name, max_seq_len=max(recipe.context, 256)), recipe, tmp,
                  progress=progress)
            replace_dir(tmp, run)
    return runs


def trace_pair(text: str, cache_dir: str | Path | None = None, top_k: int = 5, progress: bool = False,
               recipe: TrainConfig = TRACE_RECIPE) -> dict:
    """{"text", "models": {"2017": trace, "2024": trace}}; each trace has "stages" (per-token rms,
    mean, var lists; "normalized" for post-LN), "tokens", "top" predictions after the last token,
    and "preset", "params", "val_loss", "steps"."""
    out = {"text": text, "models": {}}
    for arch, run in ensure_pair(cache_dir, progress, recipe).items():
        model, tok, state = load_trained(run)
        t = trace_model(model, tok, text, top_k)
        t.pop("logits")
        vals = [r["val_loss"] for r in state["history"] if "val_loss" in r]
        out["models"][arch] = {"preset": PAIR[arch], "params": model.num_parameters(), "steps": state["step"],
                               "val_loss": vals[-1] if vals else None, **t}
    return out


def format_table(result: dict, token: int = -1) -> str:
    """Text table of RMS / mean / variance at one token position, both models side by side."""
    a, b = result["models"]["2017"], result["models"]["2024"]
    lines = [f"token {token % len(a['tokens'])} of {len(a['tokens'])}: {a['tokens'][token]!r}",
             f"{'stage':<28}{'2017 rms':>10}{'mean':>9}{'var':>10}   {'2024 rms':>10}{'mean':>9}{'var':>10}"]
    rows_b = {s["name"]: s for s in b["stages"]}
    names = [s["name"] for s in a["stages"]] + [s["name"] for s in b["stages"] if s["name"] not in
                                                {x["name"] for x in a["stages"]}]
    rows_a = {s["name"]: s for s in a["stages"]}
    order = [n for n in names if n != "logits" and n != "final norm"] + ["final norm", "logits"]
    for name in order:
        cells = []
        for rows in (rows_a, rows_b):
            s = rows.get(name)
            cells.append(f"{s['rms'][token]:>10.3f}{s['mean'][token]:>9.3f}{s['var'][token]:>10.3f}" if s
                         else f"{'-':>10}{'-':>9}{'-':>10}")
        lines.append(f"{name:<28}{cells[0]}   {cells[1]}")
    lines.append("")
    for arch, m in result["models"].items():
        top = ", ".join(f"{p['token']!r} {p['prob']:.2f}" for p in m["top"])
        lines.append(f"{arch} ({m['preset']}, {m['params']:,} params, val loss {m['val_loss']:.3f}): next -> {top}")
    return "\n".join(lines)


def plot_pair(result: dict, path: str | Path, token: int = -1) -> None:
    """RMS and variance of the stream per stage, both models on one axis of stage names, so that
    'block 1 after attention' is the same x for both (a stage a model lacks is simply absent)."""
    order: list[str] = []
    for m in result["models"].values():
        for s in m["stages"]:
            if s["name"] != "logits" and s["name"] not in order:
                order.append(s["name"])
    # "+ positions" belongs right after the embeddings; blocks in order; the final norm last.
    order.sort(key=lambda n: (0, 0) if n == "embeddings" else (1, 0) if n == "+ positions" else
               (3, 0) if n == "final norm" else (2, _stage_key(n)))
    x = {n: i for i, n in enumerate(order)}
    fig, axes = figure(12, 4.5, ncols=2, dpi=100)
    for arch, m in result["models"].items():
        stages = [s for s in m["stages"] if s["name"] in x]
        xs = [x[s["name"]] for s in stages]
        axes[0].plot(xs, [s["rms"][token] for s in stages], "o-", label=f"{arch} ({m['preset']})")
        axes[1].plot(xs, [s["var"][token] for s in stages], "o-", label=f"{arch} ({m['preset']})")
    for ax in axes:
        ax.set_xticks(range(len(order)), order, rotation=60, ha="right", fontsize=7)
        ax.legend(fontsize=8)
    axes[0].set(ylabel="RMS of the residual stream", yscale="log", title="stream size by stage (last token)")
    axes[1].set(ylabel="variance over features", yscale="log", title="variance by stage (last token)")
    save_png(fig, path)


def _stage_key(name: str) -> tuple[int, int]:
    """'block 3 after feed-forward' -> (3, 1)."""
    parts = name.split()
    return int(parts[1]), 0 if "attention" in name else 1
