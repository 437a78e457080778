"""Language-model evaluation: the next-token loss and a text's perplexity.

The loss is the mean cross-entropy of next-token prediction, in nats per token: what training
minimizes, validation reports and the layout check compares. It lives here, below training/,
diagnostics/ and the commands, so all of them score a model the same way.

`sliding_perplexity` scores a long text with windows of `context` tokens that advance by
`stride`; each window scores only the tokens the previous windows did not, so with
stride < context every scored token sees at least context - stride tokens of history (the
strided evaluation of transformers' perplexity guide). The first token is never scored
(nothing predicts it).
    perplexity = exp(total negative log-likelihood / tokens scored)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def lm_loss(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    logits = model(windows[:, :-1])  # (b, t, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten())


@torch.no_grad()
def token_losses(model, ids: torch.Tensor, position_ids: torch.Tensor | None = None, chunk: int = 1024) -> torch.Tensor:
    """The loss of each next token of `ids` (1, n): (n - 1,) float32 nats, losses[i] for predicting
    ids[i + 1]. The head runs on `chunk` tokens at a time, so memory holds (chunk, V) logits, never
    (n, V): 32k tokens of a 49,152-token vocabulary would be 6.4 GB of float32 logits."""
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"token_losses takes one sequence of at least 2 tokens, shape (1, n); got {tuple(ids.shape)}")
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 token, got {chunk}")
    x = model.hidden(ids, position_ids)[0, :-1]  # (n - 1, D): each position predicts the next token
    targets = ids[0, 1:]
    out = torch.empty(targets.shape[0], dtype=torch.float32, device=ids.device)
    for a in range(0, targets.shape[0], chunk):
        logits = model.logits(x[a:a + chunk]).float()  # (chunk, V)
        out[a:a + chunk] = F.cross_entropy(logits, targets[a:a + chunk], reduction="none")
    return out


@torch.no_grad()
def evaluate(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 16) -> float:
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i: i + batch_size]
        total += float(lm_loss(model, chunk)) * len(chunk)
    model.train(was)
    return total / len(windows)


def _windows(n: int, context: int, stride: int):
    """(begin, end, new) of each window over n tokens: tokens begin..end-1 go in, and the last `new`
    targets (positions end-new .. end-1) are the ones no earlier window scored. A window predicts at
    most end - begin - 1 targets (its first token has no history in it): with stride = context the
    windows do not overlap and each window's first token goes unscored, as in transformers'
    perplexity guide, whose labels shift the same way."""
    starts, prev_end = [0], 1
    while starts[-1] + context < n:  # the last window ends at the last token
        starts.append(starts[-1] + stride)
    for begin in starts:
        end = min(begin + context, n)
        new = min(end - prev_end, end - begin - 1)
        if new > 0:
            yield begin, end, new
            prev_end = end


def _check(model, ids: list[int], context: int, stride: int) -> None:
    if len(ids) < 2:
        raise ValueError(f"need at least 2 tokens to measure perplexity, the text has {len(ids)}")
    if not 2 <= context <= model.cfg.max_seq_len:
        raise ValueError(f"--context must be in 2..{model.cfg.max_seq_len} (the model's context), got {context}")
    if not 1 <= stride <= context:
        raise ValueError(f"--stride must be in 1..{context} (the context), got {stride}")


@torch.no_grad()
def growing_token_losses(model, ids: torch.Tensor, first: int, step: int, chunk: int = 1024) -> torch.Tensor:
    """token_losses as a generation that reads the sequence a piece at a time sees them: tokens
    0..first-1 in one pass, then `step` tokens at a time after a KV cache of the earlier ones. For
    RoPE whose frequencies follow the length (dynamic NTK, LongRoPE), tokens a..a+step-1 then turn
    with the frequencies of length a + step, as at that point of a generation; one pass over all n
    tokens would give every token the frequencies of length n (transformers' forward does that).
    Memory: the cache of n tokens and (step, n) attention scores per layer; step=1 is generation."""
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"growing_token_losses takes one sequence of at least 2 tokens, shape (1, n); got {tuple(ids.shape)}")
    if first < 1 or step < 1:
        raise ValueError(f"first and step must be at least 1 token, got {first} and {step}")
    from llamablock.kv_cache import KVCache

    n = ids.shape[1]
    cache = KVCache(model.cfg, batch_size=1, max_len=n, dtype=next(model.parameters()).dtype, device=ids.device)
    out = torch.empty(n - 1, dtype=torch.float32, device=ids.device)
    a = 0
    while a < n - 1:
        b = min(a + (first if a == 0 else step), n - 1)  # tokens a..b-1 go in; they predict a+1..b
        x = model.hidden(ids[:, a:b], cache=cache)[0]  # (b - a, D)
        for c in range(0, b - a, chunk):
            logits = model.logits(x[c:c + chunk]).float()  # (chunk, V)
            out[a + c:a + c + logits.shape[0]] = F.cross_entropy(logits, ids[0, a + 1 + c:a + 1 + c + logits.shape[0]],
                                                                 reduction="none")
        a = b
    return out


def sliding_windows(n: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, new) of each window of the strided evaluation over n tokens: tokens begin..end-1
    go in, and the losses of the last `new` targets (tokens end-new .. end-1) are the ones kept.
    Every target 1..n-1 is kept exactly once, and a kept target p sees min(p, context - stride)
    tokens of history or more (tests/studies/test_rope_eval_reference.py)."""
    # stride == context would leave each later window's first target with no history at all.
    if not (n >= 2 and 2 <= context and 1 <= stride < context):
        raise ValueError(f"sliding windows need n >= 2 tokens, context >= 2 and 1 <= stride < context; "
                         f"got n={n}, context={context}, stride={stride}")
    return list(_windows(n, context, stride))


@torch.no_grad()
def sliding_token_losses(model, ids: torch.Tensor, context: int, stride: int, chunk: int = 1024) -> torch.Tensor:
    """The strided evaluation kept token by token: (n - 1,) float32 nats for `ids` (1, n), losses[i]
    for predicting ids[i + 1] from the window that kept it (`sliding_windows`), each window at
    positions 0.. as the model was trained. A window's last token is only a target, so it is not
    run: the queries sit at positions 0..context-2 (a model trained on L positions slides with
    context L + 1). The head runs on the kept tokens only, `chunk` at a time."""
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"sliding_token_losses takes one sequence, shape (1, n); got {tuple(ids.shape)}")
    out = torch.empty(ids.shape[1] - 1, dtype=torch.float32, device=ids.device)
    for begin, end, new in sliding_windows(ids.shape[1], context, stride):
        x = model.hidden(ids[:, begin:end - 1])[0, -new:]  # (new, D): the states that predict the kept targets
        targets = ids[0, end - new:end]
        for a in range(0, new, chunk):
            logits = model.logits(x[a:a + chunk]).float()  # (chunk, V)
            out[end - new - 1 + a:end - new - 1 + a + logits.shape[0]] = F.cross_entropy(
                logits, targets[a:a + chunk], reduction="none")
    return out


@torch.no_grad()
def sliding_perplexity(model, ids: list[int], context: int, stride: int, progress: bool = False) -> tuple[float, int]:
    """(perplexity, tokens scored) of `ids` under `model`."""
    _check(model, ids, context, stride)
    from tqdm import tqdm

    x = torch.tensor(ids, device=next(model.parameters()).device)[None]  # (1, n), where the model is
    nll, scored = 0.0, 0
    windows = list(_windows(len(ids), context, stride))
    for begin, end, new in tqdm(windows, desc="perplexity", unit="window", disable=not progress):
        logits = model(x[:, begin:end])[0, -new - 1:-1].float()  # (new, V): predictions of those targets
        nll += F.cross_entropy(logits, x[0, end - new:end], reduction="sum").item()
        scored += new
    return math.exp(nll / scored), scored


@torch.no_grad()
def compare_to_reference(model, reference, ids: list[int], context: int, stride: int,
                         progress: bool = False) -> dict:
    """How far `model` (a quantized format, say) strays from `reference` (the same weights in float32:
    the file's exact dequantization) on the same windows, as llama.cpp's `llama-perplexity
    --kl-divergence` reports it: both perplexities and their ratio, the mean over scored tokens of
    KL(reference || model) of the next-token distributions in nats, and how often both put the same
    token first. Each token's distributions come from the same window of history in both models."""
    _check(model, ids, context, stride)
    from tqdm import tqdm

    x = torch.tensor(ids)[None]  # (1, n); the packed formats and their float reference run on the CPU
    nll = {"model": 0.0, "reference": 0.0}
    kl, same, scored = 0.0, 0, 0
    windows = list(_windows(len(ids), context, stride))
    for begin, end, new in tqdm(windows, desc="compare", unit="window", disable=not progress):
        targets = x[0, end - new:end]
        logp = {}
        for name, m in (("model", model), ("reference", reference)):
            logp[name] = F.log_softmax(m(x[:, begin:end])[0, -new - 1:-1].double(), dim=-1)  # (new, V)
            nll[name] -= logp[name].gather(1, targets[:, None]).sum().item()
        ref = logp["reference"]
        kl += (ref.exp() * (ref - logp["model"])).sum().item()  # sum over tokens of KL(ref || model)
        same += (ref.argmax(-1) == logp["model"].argmax(-1)).sum().item()
        scored += new
    ppl = {name: math.exp(v / scored) for name, v in nll.items()}
    return {"perplexity": ppl["model"], "reference_perplexity": ppl["reference"],
            "perplexity_ratio": ppl["model"] / ppl["reference"], "mean_kl": kl / scored,
            "top1_agreement": same / scored, "tokens_scored": scored}
