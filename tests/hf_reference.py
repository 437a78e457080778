"""Tiny random transformers models, the independent reference for parity tests.

Weights are redrawn at a larger scale than transformers' init (std 0.02 makes every logit
nearly zero and a parity test nearly vacuous): matrices N(0, 0.15^2), biases N(0, 0.1^2),
norm scales 1 + N(0, 0.1^2) (Gemma's stored w: N(0, 0.1^2)).
"""

from __future__ import annotations

import torch
import transformers

FAMILIES = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "gemma": transformers.GemmaConfig,
    "qwen3": transformers.Qwen3Config,
    "gemma2": transformers.Gemma2Config,
    "gemma3_text": transformers.Gemma3TextConfig,
    "phi3": transformers.Phi3Config,
}


def tiny_hf_config(family: str, n_heads: int = 4, n_kv: int = 2, tied: bool = False, **extra):
    kw = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=8,
              max_position_embeddings=4096, tie_word_embeddings=tied, rms_norm_eps=1e-6,
              attn_implementation="eager")
    if family == "mistral":
        kw["sliding_window"] = 8
    if family.startswith("gemma") or family == "qwen3":
        kw["head_dim"] = 16  # these heads' width is independent of hidden_size / heads
    if family == "phi3":  # its defaults name token 32000, outside a 97-token vocabulary
        kw.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    kw.update(extra)
    return FAMILIES[family](**kw)


def tiny_hf_model(family: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return redraw(transformers.AutoModelForCausalLM.from_config(tiny_hf_config(family, **kw)), family, seed)


def redraw(model, family: str, seed: int = 0):
    """`model`'s weights redrawn at the scale above (see the module docstring)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                base = 0.0 if family.startswith("gemma") else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return model.eval()


def max_logit_gap_at_offsets(hf, ours, vocab: int = 97, t: int = 24) -> float:
    """max |logit difference| of `ours` against transformers' `hf` on two rows of t random tokens:
    row 0 at positions 0..t-1, row 1 starting 3000 in with gaps of 7, so relative positions differ
    from 0..t-1 and a wrong angle changes the logits (a constant offset alone would not)."""
    ids = torch.randint(0, vocab, (2, t))
    pos = torch.stack([torch.arange(t), 3000 + 7 * torch.arange(t)])
    with torch.no_grad():
        ref = hf(input_ids=ids, position_ids=pos).logits
        got = ours(ids, position_ids=pos)
    assert got.shape == ref.shape
    return (got - ref).abs().max().item()
