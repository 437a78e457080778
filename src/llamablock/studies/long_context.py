"""Train short, test long (module section 15.2, measured): loss by position past the training length.

Three small 2024-style models (pre-LN RMSNorm, SwiGLU, GQA) that differ only in `position`
are trained on windows of L tokens: RoPE, a learned table, ALiBi. Each is then evaluated on
validation windows of 2L, 4L and 8L tokens, loss averaged over windows at every position:

  * RoPE, without fine-tuning, under each scaling type of `rope_scaling.py` with factor
    s = length / L and original length L: none, linear (position interpolation), ntk (static
    NTK-aware base), dynamic (NTK with the factor grown from the current length), yarn;
  * RoPE after a short fine-tune at 4L with linear and with yarn (s = 4), and unscaled for the same
    steps: the control for the gain any extra training gives an undertrained model;
  * ALiBi as trained (no parameters depend on length);
  * learned positions only up to L: the table has no row past L-1, so the model is undefined
    there (positions.py raises) and is evaluated only where it is defined.
The summary gives mean loss in position bands [0, L), [L, 2L), [2L, 4L), [4L, 8L). Each curve is
kept window by window too (`window_curves`): the evaluation window is the unit of sampling, since
neighbouring positions share a window and loss trends with position, so a margin for a difference
of curves is a standard error over windows, each difference taken inside one window.

`run_long_context(...) -> dict` is the function the lab calls; `python -m llamablock.studies.long_context`
prints the table and writes a plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from llamablock.model import Decoder
from llamablock.presets import preset
from llamablock.training.train import TrainConfig, get_data, train
from llamablock.util.files import atomic_write
from llamablock.util.plots import pyplot, save_png

SIZE = dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2)
METHODS = ("none", "linear", "ntk", "dynamic", "yarn")


def rope_scaling_for(method: str, factor: float, original: int) -> dict | None:
    if method == "none":
        return None
    d = {"rope_type": method, "factor": float(factor)}
    if method in ("yarn", "linear", "ntk"):
        d["original_max_position_embeddings"] = original
    return d


@torch.no_grad()
def window_losses(model: Decoder, ids: torch.Tensor, length: int, windows: int = 16, batch: int = 4) -> torch.Tensor:
    """(windows, length) next-token loss at positions 0..length-1 of `windows` evenly spaced windows, float64."""
    model.eval()
    starts = torch.linspace(0, len(ids) - length - 2, windows).long().tolist()
    rows = []
    for i in range(0, len(starts), batch):
        w = torch.stack([ids[s: s + length + 1] for s in starts[i: i + batch]])  # (b, length + 1)
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten(), reduction="none")
        rows.append(loss.view(len(w), length).double())
    return torch.cat(rows)


def loss_by_position(model: Decoder, ids: torch.Tensor, length: int, windows: int = 16, batch: int = 4) -> list[float]:
    """Mean next-token loss at positions 0..length-1 over `windows` evenly spaced windows."""
    return window_losses(model, ids, length, windows, batch).mean(0).tolist()


def bands(curve: list[float], L: int) -> dict[str, float]:
    out, lo = {}, 0
    for hi in (L, 2 * L, 4 * L, 8 * L):
        if hi <= len(curve):
            out[f"{lo}-{hi}"] = sum(curve[lo:hi]) / (hi - lo)
        lo = hi
    return out


def _with_rope(model: Decoder, scaling: dict | None) -> Decoder:
    """The same weights under another rope_scaling (attention reads cfg at every forward)."""
    m = Decoder(model.cfg.replace(rope_scaling=scaling))
    m.load_state_dict(model.state_dict())
    return m.eval()


def run_long_context(L: int = 64, steps: int = 300, finetune_steps: int = 40, lengths=(2, 4, 8),
                     batch_size: int = 16, seed: int = 0, windows: int = 16, size: dict | None = None,
                     progress: bool = False, log=print) -> dict:
    size = {**SIZE, **(size or {})}
    t = TrainConfig(steps=steps, batch_size=batch_size, context=L, lr=1e-3, warmup=max(1, steps // 10),
                    eval_every=steps, eval_windows=32, seed=seed)
    val = get_data(t).val
    longest = max(lengths) * L
    if len(val) < longest + 2 + windows:
        raise ValueError(f"the validation split ({len(val)} tokens) is too short for windows of {longest}")
    per_window: dict[str, dict[int, torch.Tensor]] = {}  # name -> length -> (windows, length)
    trained = {}
    for pos in ("rope", "learned", "alibi"):
        start = time.perf_counter()
        cfg = preset("llama-2024-small", position=pos, max_seq_len=L, **size)
        trained[pos] = train(cfg, t, None, progress=progress)["model"].eval()
        if log:
            log(f"  trained {pos} at L={L}: {time.perf_counter() - start:.0f} s")
    per_window["learned"] = {L: window_losses(trained["learned"], val, L, windows)}  # defined only up to L
    per_window["alibi"] = {k * L: window_losses(trained["alibi"], val, k * L, windows) for k in (1, *lengths)}
    for method in METHODS:
        per_window[f"rope {method}"] = {L: window_losses(trained["rope"], val, L, windows)} if method == "none" else {}
        for k in lengths:
            m = _with_rope(trained["rope"], rope_scaling_for(method, k, L))
            per_window[f"rope {method}"][k * L] = window_losses(m, val, k * L, windows)
    ft_len = 4 * L if 4 in lengths else max(lengths) * L
    for method in ("none", "linear", "yarn"):  # none: the control, the same extra steps unscaled
        scaling = rope_scaling_for(method, ft_len // L, L)
        start = time.perf_counter()
        ft = TrainConfig(**{**dataclasses.asdict(t), "steps": finetune_steps, "context": ft_len, "lr": 3e-4,
                            "warmup": max(1, finetune_steps // 10), "eval_every": finetune_steps,
                            "batch_size": max(1, batch_size * L // ft_len)})
        cfg = trained["rope"].cfg.replace(rope_scaling=scaling, max_seq_len=ft_len)
        model = train(cfg, ft, None, progress=progress, init_state=trained["rope"].state_dict())["model"].eval()
        per_window[f"rope {method} + fine-tune"] = {ft_len: window_losses(model, val, ft_len, windows)}
        if log:
            log(f"  fine-tuned rope {method} at {ft_len} for {finetune_steps} steps: {time.perf_counter() - start:.0f} s")
    curves = {name: {str(n): w.mean(0).tolist() for n, w in per.items()} for name, per in per_window.items()}
    summary = {name: {n: bands(c, L) for n, c in per.items()} for name, per in curves.items()}
    return {"L": L, "lengths": [k * L for k in lengths], "steps": steps, "finetune_steps": finetune_steps,
            "finetune_length": ft_len, "windows": windows, "curves": curves, "summary": summary,
            "window_curves": {name: {str(n): w.tolist() for n, w in per.items()} for name, per in per_window.items()},
            "notes": ["learned positions: evaluated only at L; the table has no entry past position L-1"]}


def format_table(result: dict) -> str:
    L = result["L"]
    band_names = [f"{lo}-{hi}" for lo, hi in ((0, L), (L, 2 * L), (2 * L, 4 * L), (4 * L, 8 * L))]
    head = f"{'model':<28}{'eval len':>9}" + "".join(f"{b:>11}" for b in band_names)
    lines = [head, "-" * len(head)]
    for name, per in result["summary"].items():
        for n, b in per.items():
            lines.append(f"{name:<28}{n:>9}" + "".join(f"{b[x]:>11.3f}" if x in b else f"{'-':>11}" for x in band_names))
    lines.append(f"mean validation loss (nats/char) by position band; trained at L={L}. " + " ".join(result["notes"]))
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    """Loss by position at each evaluated length; one colour per scheme across panels (fine-tuned
    curves dashed), a legend in every panel for the schemes it shows."""
    lengths = sorted({int(n) for per in result["curves"].values() for n in per})
    colours = {n: f"C{i % 10}" for i, n in enumerate(result["curves"])}
    fig, axes = pyplot().subplots(1, len(lengths), figsize=(5 * len(lengths), 4), sharey=True, dpi=100)
    for ax, n in zip(axes, lengths, strict=True):
        for scheme, per in result["curves"].items():
            if str(n) in per:
                c = per[str(n)]
                k = max(1, len(c) // 64)  # smooth: mean over runs of k positions
                xs = list(range(0, len(c) - k + 1, k))
                ax.plot(xs, [sum(c[i:i + k]) / k for i in xs], label=scheme, lw=1, color=colours[scheme],
                        ls="--" if "fine-tune" in scheme else "-")
        ax.axvline(result["L"], color="k", ls=":", lw=0.8)
        ax.set(title=f"evaluated at {n} tokens (trained at {result['L']})", xlabel="position")
        ax.legend(fontsize=6)
    axes[0].set_ylabel("loss (nats/char)")
    save_png(fig, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m llamablock.studies.long_context", description=__doc__.split("\n\n")[0])
    p.add_argument("--L", type=int, default=64, help="training context (default %(default)s)")
    p.add_argument("--steps", type=int, default=300, help="training steps per model (default %(default)s)")
    p.add_argument("--finetune-steps", type=int, default=40, help="fine-tune steps at 4L (default %(default)s)")
    p.add_argument("--out", default="long-context-out", help="folder for results.json and loss_by_position.png")
    args = p.parse_args(argv)
    result = run_long_context(args.L, args.steps, args.finetune_steps, log=lambda line: print(line, flush=True))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(result)))
    plot(result, out / "loss_by_position.png")
    print(format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
