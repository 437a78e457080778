"""Flush-to-zero while a command runs a model: denormal floats read and written as zero.

A float32 below 2^-126 (about 1.2e-38) is denormal, and an x86 core handles each operation on
one with a microcode assist, dozens of times an ordinary operation's cost. Inference makes them:
softmax turns a score far below the row's largest into a probability that small, and a model's
activations can shrink there. A batched matrix product over such probabilities runs many times
slower, with no effect on any result worth its rounding: every value flushed is below
float32's resolution of the sums it joins. llamablock turns it on for the commands that run a
model (`llamablock.cli` INFERENCE), not in the library, whose callers keep their own
floating-point state; `llamablock bench size` profiles steps the same way
(benchmarks/step_profile.py).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def flushed_denormals():
    """Denormals flushed to zero inside (torch.set_flush_denormal: the calling thread's and its
    pool's), off again after: torch has no getter for the state, and off is its default. Yields
    whether this CPU supports it."""
    supported = torch.set_flush_denormal(True)
    try:
        yield supported
    finally:
        torch.set_flush_denormal(False)
