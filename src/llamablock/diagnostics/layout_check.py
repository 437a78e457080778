"""Are a checkpoint's W_q/W_k rows in the RoPE pair layout the model rotates? (section 15.1)

RoPE turns pairs of query/key features. Meta's checkpoints pair neighbours (x0, x1), (x2, x3)
("interleaved"); transformers pairs each feature with the one half a head away ("half",
rotate_half), and its conversion script permutes the rows of W_q and W_k to match
(`rope.permute_qk`; llama.cpp's converter permutes them back). A checkpoint converted without
that permutation, or permuted twice, loads without any error and runs every shape correctly,
but each head's angles then turn the wrong feature pairs: the q/k layout mix-up.

No weight statistic tells the two orders apart, so the check asks the model: the next-token
loss on a stretch of real text with the rows as loaded, and with them permuted as the fix for a
mix-up would permute them (to the model's own layout, reading them as the other one). A trained
model is much worse under the wrong order (tests/diagnostics/test_layout_check.py shows it on SmolLM2-135M);
random weights are not, and the check says it cannot tell.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llamablock.model import Decoder
from llamablock.rope import permute_qk
from llamablock.runtime.evaluate import lm_loss

MARGIN = 0.5  # nats per token between the two losses before either order is called right


@dataclass(frozen=True)
class LayoutCheck:
    layout: str  # the layout the model rotates: "half" or "interleaved"
    loss_as_loaded: float  # mean next-token loss, nats
    loss_permuted: float  # the same with W_q/W_k rows permuted as a mix-up's fix would
    verdict: str  # "consistent", "mixed up" or "undecided"

    def message(self) -> str:
        other = "interleaved" if self.layout == "half" else "half"
        losses = f"loss {self.loss_as_loaded:.3f} nats as loaded, {self.loss_permuted:.3f} with the rows permuted"
        if self.verdict == "consistent":
            return f"q/k rows match the model's {self.layout!r} RoPE layout ({losses})"
        if self.verdict == "mixed up":
            return (f"q/k rows are in the {other!r} order while the model rotates {self.layout!r} pairs ({losses}); "
                    f"fix: layout_check.permute_qk_rows(model, to={self.layout!r}), which permutes every layer's "
                    "W_q and W_k (and their biases) with rope.permute_qk")
        return (f"cannot tell: the two orders give losses within {MARGIN} nats ({losses}); "
                "the weights may be untrained, or the text too short")


def permute_qk_rows(model: Decoder, to: str) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Permute every layer's W_q/W_k rows (and biases) in place into layout `to` (rope.permute_qk);
    returns (parameter, its previous data) to undo it."""
    cfg, saved = model.cfg, []
    for layer in model.layers:
        for lin, heads in ((layer.attn.wq, cfg.n_heads), (layer.attn.wk, cfg.n_kv_heads)):
            for p in (lin.weight, lin.bias):
                if p is not None:
                    saved.append((p, p.data))
                    p.data = permute_qk(p.data, heads, cfg.head_dim, cfg.rotary_dim, to=to)
    return saved


def check_layout(model: Decoder, ids: torch.Tensor) -> LayoutCheck:
    """Compare the loss on ids (b, t) with the rows as loaded and permuted; the model is restored."""
    if model.cfg.position != "rope":
        raise ValueError(f"the model uses position={model.cfg.position!r}: there are no RoPE pairs to check")
    if ids.shape[-1] < 16:
        raise ValueError(f"give at least 16 tokens of text to compare losses on, got {ids.shape[-1]}")
    layout = model.cfg.rope_layout
    with torch.no_grad():
        as_loaded = lm_loss(model, ids).item()  # mean next-token loss, nats
        saved = permute_qk_rows(model, to=layout)
        try:
            permuted = lm_loss(model, ids).item()
        finally:
            for p, data in saved:
                p.data = data
    if permuted < as_loaded - MARGIN:
        verdict = "mixed up"
    elif as_loaded < permuted - MARGIN:
        verdict = "consistent"
    else:
        verdict = "undecided"
    return LayoutCheck(layout, as_loaded, permuted, verdict)
