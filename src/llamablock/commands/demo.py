"""`llamablock demo`: the two presets of section 15.6 side by side, and one forward pass each."""

from __future__ import annotations

import torch

from llamablock.model import Decoder
from llamablock.presets import preset


def add_arguments(p) -> None:
    p.add_argument("--old", default="gpt-2017-small", help="preset for the 2017 model (default: %(default)s)")
    p.add_argument("--new", default="llama-2024-small", help="preset for the 2024 model (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=64, help="length of the random input (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and input (default: %(default)s)")


def _row(label: str, a, b) -> str:
    return f"{label:<28}{str(a):>18}{str(b):>18}"


def run(args) -> int:
    torch.manual_seed(args.seed)
    old, new = preset(args.old), preset(args.new)
    if args.tokens <= 0 or args.tokens > min(old.max_seq_len, new.max_seq_len):
        raise ValueError(f"--tokens must be in 1..{min(old.max_seq_len, new.max_seq_len)}, got {args.tokens}")
    models = [Decoder(old).eval(), Decoder(new).eval()]
    print(_row("", args.old, args.new))
    print(_row("position", old.position, new.position))
    print(_row("norm", f"{old.norm} ({old.norm_placement})", f"{new.norm} ({new.norm_placement})"))
    print(_row("feed-forward", f"{old.ffn} d_ff={old.d_ff}", f"{new.ffn} d_ff={new.d_ff}"))
    print(_row("query / kv heads", f"{old.n_heads} / {old.n_kv_heads}", f"{new.n_heads} / {new.n_kv_heads}"))
    print(_row("biases", old.qkv_bias, new.qkv_bias))
    print(_row("tied embeddings", old.tie_embeddings, new.tie_embeddings))
    print(_row("parameters", f"{models[0].num_parameters():,}", f"{models[1].num_parameters():,}"))
    print(_row("KV bytes / token (fp16)", f"{old.kv_bytes_per_token(2):,}", f"{new.kv_bytes_per_token(2):,}"))
    ids = torch.randint(0, min(old.vocab_size, new.vocab_size), (1, args.tokens))
    with torch.no_grad():
        logits = [m(ids) for m in models]
    print(_row("forward pass logits", tuple(logits[0].shape), tuple(logits[1].shape)))
    return 0
