"""The static decode step compiled ahead of time by AOTInductor, cached as a package on disk.

torch.compile re-traces the step in every new process (dynamo, AOTAutograd, freezing: ~16 s for
SmolLM2 even with a warm cache) and launches its kernels from Python at every step. AOTInductor
compiles an exported program into a shared library with a C++ launcher; a later process loads
the package instead (2.7 s for SmolLM2 in q8: the package, 317 MB with its weights, is unpacked on
every load). BENCHMARKS.md's decode table: q8 101 tokens/s, where torch.compile reached 80-86 in
earlier runs. Tests check the package's logits against the eager step (1e-4, float32).

    runner = AOTIStep(static, fmt, options)     # static: llamablock.static_decode.StaticDecoder
    logits = runner(ids, pos)                   # writes the step's key/value into static's cache

Export: `torch.export` of `static.step` with the per-layer caches as inputs that the program
writes in place (as module buffers they would alias those inputs, which export refuses), so the
caches are un-registered from the layers and kept as plain attributes; the eager prefill keeps
writing the same tensors. Weights become constants of the package (freezing), so the package is
only valid for these exact weights: it is named by a hash of the static layout's state (weights
and quantized buffers), the config, format, cache length, inductor options and the torch version.
Packages live in `<inductor cache dir>/llamablock-aoti/` (llamablock.compile_cache) and are
written atomically (a temporary name, then a rename).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from torch import nn


class _StepWithCacheInputs(nn.Module):
    """step(ids, pos, k0, v0, k1, v1, ...) -> logits: the caches are inputs, written in place."""

    def __init__(self, static):
        super().__init__()
        self.static = static

    def forward(self, ids, pos, *caches):
        layers = self.static.layers
        saved = [(layer.k_cache, layer.v_cache) for layer in layers]
        try:
            for i, layer in enumerate(layers):
                layer.k_cache, layer.v_cache = caches[2 * i], caches[2 * i + 1]
            return self.static.step(ids, pos)
        finally:  # tracing hands in stand-ins; the layers keep the real tensors for the eager prefill
            for layer, (k, v) in zip(layers, saved):
                layer.k_cache, layer.v_cache = k, v


def _unregister_caches(static) -> list[torch.Tensor]:
    """Turn each layer's cache buffers into plain attributes; return them in input order."""
    caches = []
    for layer in static.layers:
        for name in ("k_cache", "v_cache"):
            tensor = layer._buffers.pop(name, None)
            if tensor is not None:
                object.__setattr__(layer, name, tensor)
            caches.append(getattr(layer, name))
    return caches


def package_key(static, fmt: str, options: dict) -> str:
    """A hash of everything the compiled package depends on (its weights are constants in it)."""
    h = hashlib.blake2b(digest_size=16)
    cfg = json.dumps(dataclasses.asdict(static.cfg), sort_keys=True, default=str)
    opts = json.dumps(options, sort_keys=True, default=str)
    h.update(f"{torch.__version__}|{fmt}|{static.length}|{static.batch}|{opts}|{cfg}".encode())
    for name, tensor in sorted(static.state_dict().items()):  # the caches are not in it (non-persistent)
        h.update(name.encode())
        h.update(str(tensor.dtype).encode())
        h.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def package_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "llamablock-aoti"


class AOTIStep:
    """`runner(ids (b, 1), pos (1,)) -> logits (b, vocab)` for one StaticDecoder; `compile_seconds`
    is 0 when the package came from the disk cache."""

    def __init__(self, static, fmt: str, options: dict):
        self.caches = _unregister_caches(static)
        path = package_dir() / f"{package_key(static, fmt, options)}.pt2"
        self.compile_seconds = 0.0
        if not path.is_file():
            t = time.perf_counter()
            self._compile(static, path, options)
            self.compile_seconds = time.perf_counter() - t
        self.runner = torch._inductor.aoti_load_package(str(path))
        self.path = path

    def _compile(self, static, path: Path, options: dict) -> None:
        """options: inductor settings (llamablock.compiled_decode.inductor_options)."""
        ids, pos = torch.zeros(static.batch, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        program = torch.export.export(_StepWithCacheInputs(static), (ids, pos, *self.caches), strict=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.pt2")
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=str(tmp), inductor_configs=options)
            os.replace(tmp, path)  # atomic: an interrupted compile leaves no half-written package
        finally:
            tmp.unlink(missing_ok=True)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.runner(ids, pos, *self.caches)
