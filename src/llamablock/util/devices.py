"""Which device a command runs on: `--device auto|cpu|cuda|mps`, auto meaning the best available.

Everything a forward pass creates (caches, masks, positions, RoPE angles) is made on the device
of the model's own tensors, so moving the model is all a caller does. The packed int8/int4 layers
and the compiled engine run on the CPU only (PyTorch's packed kernels, AOTInductor's CPU runner):
on another device, `--dtype auto` runs bfloat16 instead.
"""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda", "mps")


def best_device() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_device(name: str | None) -> str:
    """A usable device name for a --device choice, or ValueError saying why it is not usable here."""
    import torch

    name = name or "auto"
    if name not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return best_device()
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False)")
    if name == "mps" and not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        raise ValueError("--device mps: Apple's Metal backend is not available here")
    return name
