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
def evaluate(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 16) -> float:
    was = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i: i + batch_size]
        total += float(lm_loss(model, chunk)) * len(chunk)
    model.train(was)
    return total / len(windows)


@torch.no_grad()
def sliding_perplexity(model, ids: list[int], context: int, stride: int, progress: bool = False) -> tuple[float, int]:
    """(perplexity, tokens scored) of `ids` under `model`."""
    if len(ids) < 2:
        raise ValueError(f"need at least 2 tokens to measure perplexity, the text has {len(ids)}")
    if not 2 <= context <= model.cfg.max_seq_len:
        raise ValueError(f"--context must be in 2..{model.cfg.max_seq_len} (the model's context), got {context}")
    if not 1 <= stride <= context:
        raise ValueError(f"--stride must be in 1..{context} (the context), got {stride}")
    from tqdm import tqdm

    x = torch.tensor(ids, device=next(model.parameters()).device)[None]  # (1, n), where the model is
    n, nll, scored, prev_end = len(ids), 0.0, 0, 1
    starts = [0]
    while starts[-1] + context < n:  # the last window ends at the last token
        starts.append(starts[-1] + stride)
    for begin in tqdm(starts, desc="perplexity", unit="window", disable=not progress):
        end = min(begin + context, n)
        new = end - prev_end  # targets not scored yet: positions prev_end .. end-1
        if new <= 0:
            continue
        logits = model(x[:, begin:end])[0, -new - 1:-1].float()  # (new, V): predictions of those targets
        nll += F.cross_entropy(logits, x[0, end - new:end], reduction="sum").item()
        scored += new
        prev_end = end
    return math.exp(nll / scored), scored
