"""A Decoder with shapes but no storage and no initialisation: what a loader fills.

Built on the meta device with the `torch.nn.init` calls of module constructors turned into
no-ops: on the meta device the init functions still run, through the Python reference kernels,
whose first call imports torch._dynamo, most of a small model's load time. A loader overwrites
every parameter anyway (`Decoder.assign_weights`); transformers' `no_init_weights` skips
initialisation for the same reason.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from llamablock.config import ModelConfig
from llamablock.model import Decoder


class _SkipInit(TorchFunctionMode):
    """Turns the `torch.nn.init` calls of module constructors into no-ops."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs.get("tensor")
        return func(*args, **(kwargs or {}))


def empty_decoder(cfg: ModelConfig) -> Decoder:
    """A Decoder with parameters on the meta device and no initialisation: only shapes, for a
    loader to fill with `assign_weights` or for counting parameters."""
    with torch.device("meta"), _SkipInit():
        return Decoder(cfg)
