"""The eager engine's decode step in one C call (c/decode_step.c) over a GGUF's own blocks.

The eager Decoder runs a decode step as about a hundred torch ops a layer, each a Python call and
a dispatch, whose cost beside the block kernel's products `llamablock bench size` profiles (the
more so the smaller the model). A compiled engine removes them after a
build of minutes (`llamablock compile`); `DecodeStepEngine` removes them with none: prefill is the
eager model's (its prompt is a few large products), and each step after it is the embedding, one
call of `lb_decode_layers` through every layer (the block kernel's products, RMSNorm, RoPE, the
16-bit cache written and read in place, softmax, the gated feed-forward, the residual adds), then
the final norm and head, in torch. The C reads the model's own tensors (its blocks, norms and KV
cache), so it holds no weight twice. The server's eager batch engine (runtime/batch.py) steps all its
rows through the same call, each matrix read once for every row.

`unsupported(model)` says what it does not take, and the plan (fast/plan.py `c_step`) gives the
engine only to models it takes: the LLaMA block (static_decode.unsupported_reason: RoPE of fixed
frequencies, pre-LN, no q/k norms, sandwich norms or soft-capping), RMSNorm, a gated feed-forward,
no sliding window, every layer matrix the file's blocks, float32 activations, heads the cache
attention takes. Logits equal the eager engine's to float32 rounding, within the bound
tests/fast/kernels/test_decode_step.py states; `llamablock bench size` times both.
"""

from __future__ import annotations

import ctypes

import torch

from llamablock.fast.compiled.static_decode import unsupported_reason
from llamablock.fast.kernels import cache_attention, ggml_kernel
from llamablock.fast.kernels.file_blocks import BlockEmbedding, BlockLinear
from llamablock.runtime.engine import EagerEngine


class _Matrix(ctypes.Structure):  # c/blocks.h lb_matrix
    _fields_ = [("type", ctypes.c_int), ("layout", ctypes.c_int), ("w", ctypes.c_void_p), ("n", ctypes.c_int64),
                ("bias", ctypes.c_void_p)]


class _Layer(ctypes.Structure):  # lb_layer
    _fields_ = [*((name, _Matrix) for name in ("q", "k", "v", "o", "gate", "up", "down")),
                ("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p), ("keys", ctypes.c_void_p),
                ("values", ctypes.c_void_p)]


class _Decoder(ctypes.Structure):  # lb_decoder
    _fields_ = [*((name, ctypes.c_int64) for name in ("dim", "heads", "kv_heads", "head_dim", "rotary", "ffn",
                                                      "length")),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float),
                *((name, ctypes.c_int) for name in ("interleaved", "act", "kv_dtype", "n_layers")),
                ("layers", ctypes.POINTER(_Layer)), ("seconds", ctypes.c_void_p)]


def config_reason(cfg) -> str | None:
    """What of `cfg` the C step does not take (the plan asks before loading), or None."""
    reason = unsupported_reason(cfg)
    if reason is not None:
        return reason
    for why, bad in (("a norm other than RMSNorm", cfg.norm != "rmsnorm"),
                     ("a sliding window", cfg.sliding_window is not None),
                     (f"feed-forward {cfg.ffn!r} (gated ones only)", cfg.ffn not in ("swiglu", "geglu")),
                     (f"heads of {cfg.head_dim} features, {cfg.n_heads // cfg.n_kv_heads} a group",
                      not cache_attention.takes(cfg.head_dim, cfg.n_heads // cfg.n_kv_heads))):
        if bad:
            return why
    return None


def unsupported(model, kv_dtype: torch.dtype = torch.float16) -> str | None:
    """Why the C step cannot run `model` with a cache of `kv_dtype`, or None when it can."""
    reason = config_reason(model.cfg)
    if reason is not None:
        return reason
    matrices = [m for block in model.layers for m in (block.attn.wq, block.attn.wk, block.attn.wv, block.attn.wo,
                                                       block.ffn.w_gate, block.ffn.w_up, block.ffn.w_down)]
    for why, bad in (
            ("layer matrices other than the file's blocks", not all(isinstance(m, BlockLinear) for m in matrices)),
            ("activations other than float32", model.final_norm.weight.dtype != torch.float32),
            (f"a {kv_dtype} KV cache", kv_dtype not in cache_attention.DTYPES),
            ("no block kernel here", ggml_kernel.kernel() is None)):
        if bad:
            return why
    return None


def _matrix(layer: BlockLinear) -> _Matrix:
    bias = 0 if layer.bias is None else layer.bias.data_ptr()
    return _Matrix(ggml_kernel.TYPE_IDS[layer.type_name], ggml_kernel.GROUPED if layer.grouped else ggml_kernel.ROWS,
                   layer.blocks.data_ptr(), layer.out_features, bias)


class DecodeStep:
    """`model`'s layers as c/blocks.h's lb_decoder, over a KV cache's buffers (`bind`): calling it runs a
    step's layers on the residual streams x (b, D) float32 in place, one row per sequence."""

    def __init__(self, model, kv_dtype: torch.dtype = torch.float16, lib: ctypes.CDLL | None = None):
        reason = unsupported(model, kv_dtype)
        if reason is not None:
            raise ValueError(f"the C decode step does not take {reason}; run the eager engine")
        cfg, self.model, self.lib = model.cfg, model, lib or ggml_kernel.kernel()  # lib: another build (tests)
        # the norms' scales as the layers multiply them: Gemma's 1 + w in float32 (norm.py rms_norm)
        self.norms = [(n.offset + n.weight.detach().float()) if n.offset else n.weight.detach()
                      for layer in model.layers for n in (layer.norm1, layer.norm2)]
        self.layers = (_Layer * cfg.n_layers)()
        for i, block in enumerate(model.layers):
            a, f = block.attn, block.ffn
            self.layers[i] = _Layer(*(_matrix(m) for m in (a.wq, a.wk, a.wv, a.wo, f.w_gate, f.w_up, f.w_down)),
                                    self.norms[2 * i].data_ptr(), self.norms[2 * i + 1].data_ptr(), 0, 0)
        act = {"swiglu": 0, "geglu": 1}[model.layers[0].ffn.act]
        self.decoder = _Decoder(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rotary_dim,
                                cfg.d_ff, 0, cfg.norm_eps, model.layers[0].attn.scale,
                                int(model.rotary.layout == "interleaved"), act, 0, cfg.n_layers, self.layers, 0)
        self.cache = self.bound = None
        # the rows of a block table read by one C call each (c/dequant.c) where the model adds nothing to
        # them: BlockEmbedding's torch ops (ungroup a group of 8 rows, dequantize) cost a step more (the
        # commit that added this has the interleaved timings)
        plain = cfg.embed_scale is None and model.positions is None
        self.table = model.embed.head[0] if plain and isinstance(model.embed, BlockEmbedding) else None

    def embed(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(b, D) float32 contiguous: the embedding of ids (b, 1) at positions lengths (b,), each row the
        table row's exact value as BlockEmbedding gives it; the model's own embed_tokens where the table
        is not blocks, or an id is out of range (its error names the id)."""
        t, rows = self.table, ids.reshape(-1).tolist()
        if t is None or not all(0 <= i < t.out_features for i in rows):
            return self.model.embed_tokens(ids, lengths[:, None]).reshape(ids.shape[0], -1).contiguous()
        x = torch.empty(len(rows), t.in_features)
        for r, i in enumerate(rows):
            ggml_kernel.dequantize(t.type_name, t.blocks, t.in_features, slice(i, i + 1), t.grouped, 1, self.lib,
                                   x[r:r + 1])
        return x

    def clock(self, seconds: torch.Tensor | None) -> None:
        """Add each step's seconds in the block kernel's products and in attention to `seconds` ((2,) float64),
        or stop (None): how `llamablock bench size` profiles the step (benchmarks/step_profile.py)."""
        self.seconds = seconds  # kept alive while the C writes to it
        self.decoder.seconds = 0 if seconds is None else seconds.data_ptr()

    def bind(self, cache) -> None:
        """Read and write `cache`'s buffers, with cos/sin for each of its slots: a KVCache of batch 1 (no
        ring), or a server's BatchKVCache (runtime/batch.py), whose every row it may step."""
        buffers = getattr(cache, "all_keys", cache.keys), getattr(cache, "all_values", cache.values)
        for i, (k, v) in enumerate(zip(*buffers, strict=True)):  # (P, n_kv, L, hd) each
            if not k.is_contiguous() or not v.is_contiguous() or k.shape[2] != cache.max_len:
                raise ValueError("the C decode step takes contiguous KV cache buffers, no ring")
            self.layers[i].keys, self.layers[i].values = k.data_ptr(), v.data_ptr()
        self.decoder.length, self.decoder.kv_dtype = cache.max_len, cache_attention.DTYPES[buffers[0][0].dtype]
        cos, sin = self.model.rotary.cos_sin(torch.arange(cache.max_len)[None], torch.float32,
                                             seq_len=cache.max_len)  # (1, L, r/2)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # (L, r/2)
        rows = buffers[0][0].shape[0]
        self.work = torch.empty(self.lib.lb_decode_work(ctypes.byref(self.decoder), rows))
        self.cache, self.bound = cache, (cache.max_len, rows, buffers[0][0].data_ptr())

    def release(self) -> None:
        """Let go of the bound cache (an idle server holds none); the next call needs `bind` again."""
        self.cache = self.bound = self.cos = self.sin = self.work = None
        for layer in self.layers:
            layer.keys = layer.values = 0
        self.decoder.length = 0

    def step(self, ids: torch.Tensor, cache, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The logits (b, V) after ids (b, 1) at slot cache.length of `cache` (bound here when new or grown),
        the cache advanced by one: the embedding, the layers in C, the head. One sequence's cache, or the
        first b rows of a BatchKVCache whose rows hold lengths (b,) tokens each, left-padded."""
        buffer = getattr(cache, "all_keys", cache.keys)[0]
        if self.cache is not cache or self.bound != (cache.max_len, buffer.shape[0], buffer.data_ptr()):
            self.bind(cache)  # a new or grown cache: other buffers
        if lengths is None:
            lengths = torch.full((ids.shape[0],), cache.length)
        x = self.embed(ids, lengths)  # (b, D) float32
        self(x, cache.length, lengths)
        cache.advance(1)
        return self.model.logits(x[:, None])[:, -1]

    def __call__(self, x: torch.Tensor, front: int, lengths: torch.Tensor | None = None,
                 threads: int | None = None) -> torch.Tensor:
        """x (b, D) or (D,) float32 contiguous, one token per cache row, through every layer in place: each
        written to slot `front`, row r attending to slots front - lengths[r] .. front (its own; default
        lengths: front, one sequence filling slots 0..front - 1)."""
        if not 0 <= front < self.decoder.length:
            raise ValueError(f"position {front} is outside the bound KV cache's {self.decoder.length} slots")
        rows = 1 if x.dim() == 1 else x.shape[0]
        pos = torch.full((rows,), front) if lengths is None else lengths.to(torch.int64).contiguous()
        misfit = f"{rows} rows of lengths {{}} do not fit the bound cache ({self.bound[1]} rows, frontier {front})"
        if rows > self.bound[1] or pos.shape != (rows,):  # the C would read or write past the buffers
            raise ValueError(misfit.format(pos.tolist()))
        status = self.lib.lb_decode_layers(ctypes.byref(self.decoder), x.data_ptr(), rows, front, pos.data_ptr(),
                                           self.cos.data_ptr(), self.sin.data_ptr(), self.work.data_ptr(),
                                           threads or torch.get_num_threads())
        if status == -3:  # LB_BAD_SHAPE: the model's shapes are checked when it is built, so the lengths (the
            raise ValueError(misfit.format(pos.tolist()))  # C checks 0 <= length <= front before any work)
        if status:  # c/blocks.h's LB_ results: a type the library refuses, or no memory
            raise (MemoryError if status == -1 else ValueError)(f"the C decode step failed (status {status})")
        return x


class DecodeStepEngine(EagerEngine):
    """The eager engine (its prefill, cache and growth) whose steps run in C (`DecodeStep`)."""

    def __init__(self, model, what: str | None = None, kv_dtype: torch.dtype | None = None,
                 lib: ctypes.CDLL | None = None):
        super().__init__(model, what, kv_dtype)
        self.c_step = DecodeStep(model, self.kv_dtype, lib)

    def describe(self) -> str:
        return f"{super().describe()}; decode steps in C"

    def step(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        self._room(pos + 1)
        return self.c_step.step(ids, self.cache)  # (1, V)
