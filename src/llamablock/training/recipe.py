"""A training run's recipe: steps, batch, context, schedule, data, seed (`llamablock train`'s flags).

Kept apart from the loop (train.py) so that checkpoint verification (checkpoint.py) can read a
state.json's recipe without importing the loop that imports it. Every field is type-checked on
construction, since a state.json edited by hand reaches here.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

SEED_LIMIT = 2**40  # |seed| below this keeps every batch's generator seed within torch's 64 bits
# Byte-level BPE starts from the 256 bytes and needs one merge to be BPE; past 2**16 ids the
# trainer runs for long on this corpus, which has fewer distinct words than that.
BPE_VOCAB = (257, 2**16)


@dataclass
class TrainConfig:
    steps: int = 300
    batch_size: int = 16  # global: split across DDP processes
    context: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    # Post-LN needs a long warm-up (Xiong et al. 2020): with a short one the 2017 preset stalls at
    # the unigram loss on this corpus, so the default warms up for a third of the default run.
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_windows: int = 64  # validation windows of `context` tokens, fixed
    seed: int = 0
    corpus: str = "tiny"
    tokenizer: str = "char"
    bpe_vocab: int = 512

    def __post_init__(self):
        for f in dataclasses.fields(self):  # a state.json edited by hand may hold "fast" for lr
            v, kind = getattr(self, f.name), {"int": numbers.Integral, "float": numbers.Real, "str": str}[f.type]
            if isinstance(v, bool) or not isinstance(v, kind) or (kind is numbers.Real and not math.isfinite(v)):
                want = {"int": "a whole number", "float": "a finite number", "str": "a string"}[f.type]
                raise ValueError(f"{f.name} must be {want}, got {v!r}")
        for name in ("steps", "batch_size", "context", "eval_every", "eval_windows", "bpe_vocab"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not BPE_VOCAB[0] <= self.bpe_vocab <= BPE_VOCAB[1]:
            raise ValueError(f"bpe_vocab must be between {BPE_VOCAB[0]} (the 256 bytes and one merge) and "
                             f"{BPE_VOCAB[1]}, got {self.bpe_vocab}")
        if not abs(self.seed) < SEED_LIMIT:  # data.sample_batch seeds a generator with seed * 1_000_003 + step
            raise ValueError(f"seed must be a whole number between -2**40 and 2**40, got {self.seed}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup < 0 or self.grad_clip <= 0:
            raise ValueError("need lr > 0, 0 <= min_lr_ratio <= 1, warmup >= 0 and grad_clip > 0")
