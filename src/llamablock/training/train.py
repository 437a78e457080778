"""Training a Decoder on Shakespeare: AdamW, linear warm-up then cosine decay, gradient clipping.

Choices and their sources:
  * AdamW with betas (0.9, 0.95), weight decay only on matrices and embeddings (nanoGPT's
    `configure_optimizers`; LLaMA, Touvron et al. 2023, section 2.2, uses the same betas).
  * Learning rate: linear warm-up, then cosine decay to `min_lr_ratio` of the peak (LLaMA 2.2).
  * Gradients clipped to global norm `grad_clip` (1.0, as LLaMA).
  * Initialization: every Linear and Embedding weight N(0, 0.02), biases 0, and the two
    projections that write into the residual stream (attention `wo`, feed-forward out) scaled by
    1/sqrt(2 n_layers) (GPT-2, Radford et al. 2019, section 2.3). The same for every architecture,
    so a comparison changes only the architecture.
Determinism: the weights come from `seed`; batch k is drawn from a generator seeded by
(seed, k) (`data.sample_batch`), so a run is a function of its configs and a resumed run
repeats the uninterrupted one exactly (on the same machine and thread count).
Loss: mean cross-entropy of next-token prediction, in nats per token (runtime.evaluate.lm_loss).
Export: a run that reaches its last step also writes `<run dir>/export`, a transformers directory
for models a transformers class computes (the 2024 model) and a llamablock directory otherwise
(the 2017 model), by llamablock.io.export; `llamablock export` writes the other formats. A run
whose final export failed (a full disk) writes it at the next --resume.
The run folder: a new run claims only a new or empty folder (training.run_dir), and a run is
refused before anything is allocated when it cannot fit in memory (training.budget).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

from llamablock.config import ModelConfig
from llamablock.io.export import export_model
from llamablock.model import Decoder
from llamablock.runtime.evaluate import evaluate, lm_loss
from llamablock.training import checkpoint as ckpt
from llamablock.training import data as D
from llamablock.training import distributed as dd
from llamablock.training.budget import check_fits
from llamablock.training.recipe import SEED_LIMIT, TrainConfig  # noqa: F401  (callers import them from here)
from llamablock.training.run_dir import check_resume_dir, claim_new_run
from llamablock.util.files import EXPORT_MARKER, atomic_write, disk_full
from llamablock.util.plots import figure, save_png


def lr_at(step: int, t: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    progress = (step - t.warmup) / max(1, t.steps - t.warmup)
    floor = t.lr * t.min_lr_ratio
    return floor + 0.5 * (t.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def init_weights(model: Decoder) -> None:
    residual_std = 0.02 / math.sqrt(2 * model.cfg.n_layers)
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            last = name.rsplit(".", 1)[-1]
            std = residual_std if last in ("wo", "w_out", "w_down") else 0.02
            torch.nn.init.normal_(module.weight, 0.0, std)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)


def make_optimizer(model: torch.nn.Module, t: TrainConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(0.9, 0.95), eps=1e-8)


_DATA: dict[tuple, D.TokenData] = {}


def get_data(t: TrainConfig, tokenizer=None) -> D.TokenData:
    key = (t.corpus, t.tokenizer, t.bpe_vocab)
    if tokenizer is not None:
        return D.build_data(t.corpus, tok=tokenizer)
    if key not in _DATA:
        _DATA[key] = D.build_data(t.corpus, t.tokenizer, t.bpe_vocab)
    return _DATA[key]


def prepare_config(model_cfg: ModelConfig, t: TrainConfig, tok) -> ModelConfig:
    """The model's vocabulary is the tokenizer's (None: not built yet); the context must fit its positions."""
    cfg = model_cfg.replace(vocab_size=tok.vocab_size) if tok is not None else model_cfg
    if t.context > cfg.max_seq_len:
        raise ValueError(f"context {t.context} is longer than the model's max_seq_len {cfg.max_seq_len}; "
                         f"use --context {cfg.max_seq_len} or --set max_seq_len={t.context}")
    return cfg


@torch.enable_grad()  # a caller (or a test before us) may have turned autograd off globally
def train(model_cfg: ModelConfig | None, t: TrainConfig | None, out_dir: str | Path | None = None,
          resume: bool = False, progress: bool = True, stop_at: int | None = None,
          info: dd.DistInfo | None = None, steps: int | None = None, init_state: dict | None = None,
          resume_flags: dict | None = None, resume_model: dict | None = None) -> dict:
    """Train (or resume) and return {"model", "tokenizer", "history", "val_loss", "tokens_per_s", ...}.

    A new run claims `out_dir` only when it is new, empty or an unstarted run of ours
    (training.run_dir); the run's lock is held before any checkpoint is read, so a second trainer
    is refused by the lock rather than by a checkpoint the first one is replacing.
    With `resume`, both configs come from the newest good checkpoint in `out_dir` (a damaged newer
    one is skipped, saying so); `steps` may extend the run, and any other `resume_flags` (TrainConfig
    field -> value the user gave) or `resume_model` (ModelConfig field -> value, as "--set" or
    "--preset P" would make it) must equal the run's own: a resumed run repeats its settings.
    A finished run whose final export is missing (a full disk killed it) writes it and returns.
    `stop_at` ends the call after that many steps, as a kill would.
    `init_state` starts from given weights (a fine-tune) instead of the random init.
    """
    info = info or dd.DistInfo()
    if resume and out_dir is None:
        raise ValueError("resume needs the run directory (--out) that holds the checkpoint")
    if steps is not None:
        TrainConfig(steps=steps)  # a bad --steps is refused before any folder is touched
    lock = contextlib.ExitStack()
    if out_dir is not None and info.is_main:
        if resume:
            out_dir = check_resume_dir(out_dir)
        else:
            # A bad or oversized config is refused before the folder is claimed (vocabulary: its least).
            check_fits(prepare_config(model_cfg, t, None).replace(vocab_size=1), t)
            out_dir = claim_new_run(out_dir)
        lock.enter_context(ckpt.run_lock(out_dir))
    with lock:
        return _train(model_cfg, t, out_dir, resume, progress, stop_at, info, steps, init_state, resume_flags,
                      resume_model)


def _resumed(out_dir, resume_flags: dict | None, resume_model: dict | None):
    """(state, checkpoint path, model config, train config, tokenizer) of the run to resume;
    ValueError naming every flag that differs from the run's own."""
    path = ckpt.newest_good_checkpoint(out_dir, warn=lambda m: print(f"llamablock train: {m}", file=sys.stderr))
    state = ckpt.read_state(path)
    model_cfg = ModelConfig.from_dict(state["model_config"])
    t = TrainConfig(**state["train_config"])
    changed = [f"--{k.replace('_', '-')} {v} (this run: {getattr(t, k)})"
               for k, v in (resume_flags or {}).items() if v is not None and v != getattr(t, k)]
    own = model_cfg.to_dict()
    changed += [f"--set {k}={v} (this run: {own.get(k)})" for k, v in (resume_model or {}).items()
                if k != "vocab_size" and v != own.get(k)]
    if changed:
        raise ValueError("a resumed run keeps its own settings, but " + ", ".join(changed) + " differ; only "
                         "--steps may extend it: start a new --out to train with other settings")
    return state, path, model_cfg, t, D.tokenizer_from_dict(state["tokenizer"])


def _train(model_cfg, t, out_dir, resume, progress, stop_at, info, steps, init_state, resume_flags,
           resume_model) -> dict:
    """train(), with `out_dir` claimed and locked."""
    tok, state, path = None, None, None
    if resume:
        state, path, model_cfg, t, tok = _resumed(out_dir, resume_flags, resume_model)
    if steps is not None:
        t = dataclasses.replace(t, steps=steps)
    if state is not None and state["step"] >= t.steps:
        if info.is_main and not _exported(Path(out_dir)) and state["step"] == t.steps:
            return _export_finished(Path(out_dir), path, state, t)
        raise ValueError(f"the run in {out_dir} is finished: it reached step {state['step']} of {t.steps}; "
                         f"give --steps N with N above {state['step']} to train it further")
    data = get_data(t, tok)
    tok = data.tokenizer
    data.check_context(t.context)
    cfg = prepare_config(model_cfg, t, tok)
    check_fits(cfg, t)

    torch.manual_seed(t.seed)
    model = Decoder(cfg)
    init_weights(model)
    if init_state is not None:
        model.load_state_dict(init_state)
    opt = make_optimizer(model, t)
    start, history = 0, []
    if state is not None:
        ckpt.load_weights(path, model)
        ckpt.load_optimizer(path, opt, state)
        start, history = state["step"], state["history"]
    model.to(info.device)
    net = dd.wrap(model, info)
    val_windows = D.eval_windows(data.val, t.context, t.eval_windows).to(info.device)

    run_dir = Path(out_dir) if out_dir is not None else None
    if run_dir is not None and info.is_main:
        _write_log(run_dir, history)
    return _loop(model, net, opt, t, cfg, tok, data, val_windows, history, start, run_dir, info, progress, stop_at)


def _exported(run_dir: Path) -> bool:
    """The run's final export is whole (its marker; an export from before the marker: its config)."""
    return (run_dir / "export" / EXPORT_MARKER).is_file() or (run_dir / "export" / "config.json").is_file()


def _export_finished(run_dir: Path, path: Path, state: dict, t: TrainConfig) -> dict:
    """Write the final export of a finished run from its last checkpoint (the first attempt failed)."""
    from llamablock.io.llamablock_dir import load_checkpoint

    model, _, _ = load_checkpoint(path, verify=True)
    tok = D.tokenizer_from_dict(state["tokenizer"])
    export_model(model, state["tokenizer"], run_dir / "export", own=True)
    vals = [r["val_loss"] for r in state["history"] if "val_loss" in r]
    return {"model": model, "tokenizer": tok, "config": model.cfg, "train_config": t, "history": state["history"],
            "val_loss": vals[-1] if vals else None, "step": state["step"], "params": model.num_parameters(),
            "tokens_per_s": None, "exported_only": True}


def _loop(model, net, opt, t: TrainConfig, cfg: ModelConfig, tok, data, val_windows, history: list, start: int,
          run_dir: Path | None, info, progress: bool, stop_at: int | None) -> dict:
    """The training steps from `start`, logging and checkpointing into `run_dir` (held locked)."""
    from tqdm.auto import tqdm

    end = t.steps if stop_at is None else min(t.steps, stop_at)
    bar = tqdm(total=t.steps, initial=start, disable=not (progress and info.is_main), unit="step", dynamic_ncols=True)
    tokens_per_step = t.batch_size * t.context
    train_time, trained_steps, val = 0.0, 0, None
    net.train()
    for step in range(start, end):
        t0 = time.perf_counter()
        lr = lr_at(step, t)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = dd.shard(D.sample_batch(data.train, t.batch_size, t.context, t.seed, step), info).to(info.device)
        loss = lm_loss(net, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), t.grad_clip))
        opt.step()
        loss_value = dd.mean_over_ranks(float(loss.detach()), info)
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):  # never written to log.jsonl or a checkpoint
            raise ValueError(f"training diverged at step {step + 1}: the loss is {loss_value} (gradient norm "
                             f"{grad_norm}); the last checkpoint is kept; lower --lr or raise --warmup")
        dt = time.perf_counter() - t0
        train_time, trained_steps = train_time + dt, trained_steps + 1
        record = {"step": step + 1, "train_loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_s": tokens_per_step / dt}
        if (step + 1) % t.eval_every == 0 or step + 1 == t.steps:
            val = evaluate(model, val_windows)
            record["val_loss"] = val
        history.append(record)
        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tokens_per_step / dt:,.0f}",
                        **({"val": f"{record['val_loss']:.3f}"} if "val_loss" in record else {}))
        bar.update(1)
        if run_dir is not None and info.is_main:
            _append_log(run_dir, record)
            if "val_loss" in record or step + 1 == end:
                ckpt.save_checkpoint(run_dir, step + 1, model, opt, {
                    "model_config": cfg.to_dict(), "train_config": dataclasses.asdict(t),
                    "tokenizer": tok.to_dict(), "history": history})
    bar.close()
    dd.barrier(info)
    if run_dir is not None and info.is_main:
        plot_curves(history, run_dir / "curves.png", title=f"{cfg.position}/{cfg.norm}-{cfg.norm_placement}/{cfg.ffn}")
        if end == t.steps:  # a failure here (a full disk) is repaired by the next --resume (_export_finished)
            try:
                export_model(model, tok.to_dict(), run_dir / "export", own=True)
            except ValueError as e:
                raise ValueError(f"{e}; the run's checkpoints are whole, and `llamablock train --resume --out "
                                 f"{run_dir}` writes the missing export") from None
    vals = [r["val_loss"] for r in history if "val_loss" in r]
    return {"model": model, "tokenizer": tok, "config": cfg, "train_config": t, "history": history,
            "val_loss": vals[-1] if vals else None, "step": end, "params": model.num_parameters(),
            "tokens_per_s": trained_steps * tokens_per_step / train_time if train_time else None}


def load_trained(run_dir: str | Path) -> tuple[Decoder, object, dict]:
    """(model in eval mode, tokenizer, state) from the newest checkpoint of a run directory."""
    path = ckpt.latest_checkpoint(run_dir)
    state = ckpt.read_state(path)
    model = Decoder(ModelConfig.from_dict(state["model_config"]))
    ckpt.load_weights(path, model)
    return model.eval(), D.tokenizer_from_dict(state["tokenizer"]), state


# Logs and curves -------------------------------------------------------------------------
def _write_log(run_dir: Path, history: list[dict]) -> None:
    """Rewrite log.jsonl from the history (on resume this drops lines after the checkpoint)."""
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in history)  # a NaN is refused, never written
    with disk_full(run_dir / "log.jsonl"):
        atomic_write(run_dir / "log.jsonl", lambda p: p.write_text(text))


def _append_log(run_dir: Path, record: dict) -> None:
    line = json.dumps(record, allow_nan=False) + "\n"
    with disk_full(run_dir / "log.jsonl"), open(run_dir / "log.jsonl", "a") as f:
        f.write(line)


def plot_curves(history: list[dict], path: Path, title: str = "") -> None:
    fig, (a, b) = figure(10, 4, ncols=2, dpi=100)
    a.plot([r["step"] for r in history], [r["train_loss"] for r in history], lw=0.8, label="train")
    ev = [r for r in history if "val_loss" in r]
    a.plot([r["step"] for r in ev], [r["val_loss"] for r in ev], "o-", label="validation")
    a.set(xlabel="step", ylabel="loss (nats/token)", title=title)
    a.legend()
    b.plot([r["step"] for r in history], [r["lr"] for r in history])
    b.set(xlabel="step", ylabel="learning rate")
    with disk_full(path):
        save_png(fig, path)
