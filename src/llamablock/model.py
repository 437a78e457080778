"""The decoder: embeddings, a stack of blocks, a final norm where pre-LN, the output head.

    logits = head(final_norm(blocks(embed(ids) * embed_scale + absolute_positions)))
    (Gemma 2 then soft-caps them: c tanh(logits / c))

`forward(input_ids (b, t), position_ids (b, t) or None, cache or None, pad_mask or None)
-> logits (b, t, vocab)`. pad_mask (b, cached + t) bool, True on real tokens, lets a batch of
left-padded prompts run together: padding keys are masked out of attention (llamablock.runtime.generate).
`last_only=True` returns the logits of the last position only, (b, 1, vocab): a prefill then
skips the head's (t - 1) x d x vocab multiply (SmolLM2: 28M of its 135M weights).
Without a cache, positions default to 0..t-1; with one, they continue from the tokens already
stored. The head shares the embedding matrix when `tie_embeddings` is set.
Position information is built once, from the config: absolute positions at the embeddings
(2017), or a `Rotary` (RoPE) or `ALiBi` shared by every layer; each forward pass computes the
layers' common attention inputs (cos/sin, the mask) once (`attention_inputs`).
"""

from __future__ import annotations

import torch
from torch import nn

from llamablock.alibi import ALiBi
from llamablock.attention import AttentionInputs, attention_inputs
from llamablock.blocks import make_block
from llamablock.config import ModelConfig
from llamablock.kv_cache import Cache
from llamablock.norm import make_norm
from llamablock.positions import LearnedPositions, SinusoidalPositions
from llamablock.rope import Rotary
from llamablock.rope_scaling import RopeSpec
from llamablock.util.finite import all_finite


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = {"learned": lambda: LearnedPositions(cfg.max_seq_len, cfg.d_model),
                          "sinusoidal": lambda: SinusoidalPositions(cfg.d_model)}.get(cfg.position, lambda: None)()
        self.rotary = Rotary.from_config(cfg) if cfg.position == "rope" else None
        # Gemma 3's sliding layers turn at their own base, unscaled; the full layers take the config's RoPE.
        self.rotaries = {"full": self.rotary, "sliding": self.rotary}
        if cfg.local_rope_theta is not None:
            spec = RopeSpec(cfg.local_rope_theta, cfg.rotary_dim, cfg.max_seq_len)
            self.rotaries["sliding"] = Rotary(spec, cfg.rope_layout)
        self.alibi = ALiBi(cfg.n_heads) if cfg.position == "alibi" else None
        self.kinds = cfg.layer_kinds
        self.kinds_present = tuple(dict.fromkeys(self.kinds))  # each kind once: one set of attention inputs each
        self.layers = nn.ModuleList(make_block(cfg, i, self.rotaries[kind]) for i, kind in enumerate(self.kinds))
        # Post-LN already ends every block with a norm; pre-LN needs one before the head.
        pre = cfg.norm_placement == "pre"
        self.final_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_offset) if pre else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def embed_tokens(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        checkable = input_ids.numel() and not input_ids.is_meta  # meta tensors (shape checks) hold no values
        if checkable and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.cfg.vocab_size):
            bad = int(input_ids.max()) if int(input_ids.max()) >= self.cfg.vocab_size else int(input_ids.min())
            raise ValueError(f"token id {bad} is out of range for a vocabulary of {self.cfg.vocab_size} (0..{self.cfg.vocab_size - 1})")
        x = self.embed(input_ids)  # (b, t, D)
        if self.cfg.embed_scale is not None:
            # Gemma rounds the scale to the activation dtype first (GemmaModel's `normalizer`).
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        if self.positions is not None:
            x = x + self.positions(position_ids).to(x.dtype)
        return x

    def default_positions(self, input_ids: torch.Tensor, cache: Cache | None) -> torch.Tensor:
        start = cache.length if cache is not None else 0
        t = input_ids.shape[1]
        return torch.arange(start, start + t, device=input_ids.device).expand(input_ids.shape[0], t)

    def attention_inputs(self, position_ids: torch.Tensor, cache: Cache | None = None,
                         pad_mask: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                         kind: str | None = None) -> AttentionInputs:
        """What the attention of every layer of `kind` ("full", "sliding"; default: layer 0's)
        shares for new tokens at `position_ids` (b, t)."""
        kind = kind or self.kinds[0]
        sliding = kind == "sliding"
        return attention_inputs(position_ids, cache.length if cache is not None else 0,
                                dtype=dtype or self.embed.weight.dtype, rotary=self.rotaries[kind], alibi=self.alibi,
                                window=self.cfg.sliding_window if sliding else None, pad_mask=pad_mask,
                                key_slots=cache.key_slots() if sliding and cache is not None else None,
                                fused_causal=self.cfg.attn_softcap is None)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache: Cache | None = None, pad_mask: torch.Tensor | None = None,
                last_only: bool = False) -> torch.Tensor:
        x = self.hidden(input_ids, position_ids, cache, pad_mask)  # (b, t, D)
        if last_only:  # generation needs only the next token's logits: skip the head elsewhere
            x = x[:, -1:]
        return self.logits(x)

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
               cache: Cache | None = None, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The residual stream after the last block, (b, t, D), before the final norm and the head.
        A long sequence's loss applies `logits` to it a chunk of tokens at a time
        (runtime.evaluate.token_losses): (t, V) logits at once would not fit (32k x 49,152 floats)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, tokens), got {tuple(input_ids.shape)}")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids is empty: give at least one token")
        if position_ids is None:
            position_ids = self.default_positions(input_ids, cache)
        elif position_ids.shape != input_ids.shape:
            raise ValueError(f"position_ids shape {tuple(position_ids.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
        x = self.embed_tokens(input_ids, position_ids)  # (b, t, D)
        inputs = {kind: self.attention_inputs(position_ids, cache, pad_mask, x.dtype, kind) for kind in self.kinds_present}
        for kind, layer in zip(self.kinds, self.layers, strict=True):
            x = layer(x, inputs[kind], cache)
        if cache is not None:
            cache.advance(input_ids.shape[1])
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) residual stream -> (..., V) logits: the final norm, the head, Gemma 2's cap."""
        logits = self.head(self.final_norm(x))
        if self.cfg.final_softcap is not None:  # Gemma 2: c tanh(logits / c), as transformers' Gemma2ForCausalLM
            logits = torch.tanh(logits / self.cfg.final_softcap) * self.cfg.final_softcap
        return logits

    def assign_weights(self, state: dict[str, torch.Tensor]) -> "Decoder":
        """Take `state`'s tensors as the parameters (no copy; a model built on the meta device gets
        real storage this way), re-tie the head, switch to eval. Loaders check names and shapes
        first, so that their errors can name the tensor; non-finite values are refused here, by name,
        since a model with a NaN weight loads and runs and only its outputs are wrong."""
        bad = next((n for n, t in state.items() if t.is_floating_point() and not all_finite(t)), None)
        if bad is not None:
            raise ValueError(f"the checkpoint's {bad} holds non-finite values (NaN or infinity); it is damaged")
        self.load_state_dict(state, strict=False, assign=True)
        if self.cfg.tie_embeddings:
            self.head.weight = self.embed.weight  # assign=True gives embed the checkpoint's tensor: tie to it
        return self.eval()

    def num_parameters(self) -> int:
        """Distinct parameters (a tied head is counted once)."""
        return sum(p.numel() for p in self.parameters())
