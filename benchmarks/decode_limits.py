"""What bounds the decode benchmark's missed targets, measured in the same run rather than argued.

    int8_kernels(static)   one q8 decode step's weight matmuls at one row (M = 1), by each int8
                           kernel PyTorch has on this CPU, against the rate at which a float32
                           matrix-vector product streams its weights from memory
    float32_gemvs(static)  one float32 decode step's weight matrix-vector products (MKL) on their
                           own, in 4 KiB and in 2 MiB pages: the part of the compiled step that no
                           fusion removes
    prefill_parts(static)  a float32 prefill's weight GEMMs and its causal attention, each timed
                           on its own with the kernels both llamablock and transformers call

`static` is a llamablock.fast.compiled.static_decode.StaticDecoder (q8-quantized for int8_kernels): the real
fused matrices of SmolLM2, so the shapes, the byte counts and the weights' place in memory are a
real step's. Each function returns a Section and the numbers the decode benchmark's 'Limit' notes
quote.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import Section, ms
from llamablock.fast.compiled.huge_pages import collapse, tensor_ranges
from llamablock.fast.kernels.quant import Int8Linear
from llamablock.util.timing import time_calls

STREAM_MIB = 1024  # past any last-level cache these benchmarks ran on (the largest seen: 480 MiB): memory's rate


def stream_rate(mib: int = STREAM_MIB, repeats: int = 7) -> float:
    """Bytes per second a float32 matrix-vector product reads from a `mib` MiB matrix (best of
    `repeats`): the weight stream of a decode step with a well-tuned kernel (MKL's sgemv), from
    memory rather than cache when the matrix is larger than the last-level cache."""
    w = torch.ones(4096, mib * 2**20 // 4 // 4096)
    x = torch.ones(w.shape[1])
    t = time_calls({"mv": lambda: w @ x}, repeats=repeats, warmup=2)["mv"]["min"]
    return w.numel() * 4 / t


def int8_kernels(static, repeats: int = 7, stream_mib: int = STREAM_MIB) -> tuple[Section, float, float]:
    """-> (table, bytes of int8 weights per step, the stream rate in bytes/s of a `stream_mib` matrix)."""
    layers = [m for m in static.modules() if isinstance(m, Int8Linear)]
    nbytes = sum(m.qweight.numel() for m in layers)
    xs = {m.in_features: torch.randn(1, m.in_features, dtype=torch.bfloat16) for m in layers}  # (1, k)
    xq = {k: torch.randint(-127, 128, (1, k), dtype=torch.int8) for k in xs}  # int8 activations
    xu = {k: torch.randint(0, 256, (1, k), dtype=torch.uint8) for k in xs}
    packed = [torch.ops.onednn.qlinear_prepack(m.qweight, [1, m.in_features]) for m in layers]
    w_scale = [m.scales.float() for m in layers]
    w_zero = [torch.zeros(m.out_features, dtype=torch.long) for m in layers]

    def woq():  # what the eager q8 model runs at one row: bfloat16 x, int8 weights, per-row scale
        for m in layers:
            torch.ops.aten._weight_int8pack_mm(xs[m.in_features], m.qweight, m.scales)

    def int_mm():  # int8 x int8 -> int32, as dynamic int8 activations (llama.cpp's q8 dot products) would use
        for m in layers:
            torch._int_mm(xq[m.in_features], m.qweight.t())

    def onednn():  # oneDNN's quantized linear (PT2E's x86 path): uint8 activations, weights prepacked
        for m, p, s, z in zip(layers, packed, w_scale, w_zero, strict=True):
            torch.ops.onednn.qlinear_pointwise(xu[m.in_features], 0.02, 128, p, s, z, None, 1.0, 0,
                                               torch.bfloat16, "none", [], "")

    kernels = {"aten._weight_int8pack_mm (bfloat16 x, int8 weights)": woq,
               "torch._int_mm (int8 x, int8 weights)": int_mm,
               "onednn.qlinear_pointwise (uint8 x, int8 weights)": onednn}
    t = time_calls(kernels, repeats=repeats, warmup=2)
    rate = stream_rate(stream_mib)
    sec = Section(f"One q8 decode step's {len(layers)} weight matmuls at one row, by int8 kernel "
                  f"({nbytes / 2**20:.0f} MiB of int8 weights)", ["kernel", "min ms", "median ms", "GB/s (min)"])
    for name, r in t.items():
        sec.rows.append([name, ms(r["min"]), ms(r["median"]), f"{nbytes / r['min'] / 1e9:.1f}"])
    sec.notes.append(f"Reference: a float32 matrix-vector product (MKL) reads a {stream_mib} MiB matrix at {rate / 1e9:.1f} GB/s "
                     f"in this run; at that rate these weights take {1e3 * nbytes / rate:.1f} ms. Each row above is "
                     f"{len(layers)} eager calls (a few microseconds of dispatch each); the compiled step's own int8 "
                     "matmuls (inductor's C++ templates) are in the kernel profile below.")
    return sec, nbytes, rate


def _step_weights(static) -> list[torch.Tensor]:
    """The matrices one decode step reads: fused q/k/v, output, fused gate/up and down per layer, the head."""
    return [w for layer in static.layers
            for w in (layer.wqkv.weight, layer.wo.weight, layer.ffn.w_gate_up.weight, layer.ffn.w_down.weight)] + [static.head.weight]


def float32_gemvs(static, repeats: int = 7) -> tuple[Section, float]:
    """-> (table, median seconds in 2 MiB pages) of one float32 step's weight matrix-vector
    products, each F.linear at one row (MKL's sgemv, what the compiled float32 step calls:
    build_options.step_options), on the weights in 4 KiB pages and on a copy moved into 2 MiB
    pages as the compiled step's are (llamablock.fast.compiled.huge_pages), alternating."""
    weights = _step_weights(static)
    copies = [w.clone() for w in weights]
    moved = collapse(tensor_ranges(copies))
    xs = {k: torch.randn(1, k, dtype=weights[0].dtype) for k in {w.shape[1] for w in weights}}  # (1, k)

    def gemvs(ws):
        def run():
            for w in ws:
                F.linear(xs[w.shape[1]], w)
        return run

    t = time_calls({"4 KiB": gemvs(weights), "2 MiB": gemvs(copies)}, repeats=repeats, warmup=2)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    sec = Section(f"One float32 decode step's {len(weights)} weight matrix-vector products, timed on their own "
                  f"({nbytes / 2**20:.0f} MiB)", ["part", "min ms", "median ms", "GB/s (median)"])
    for pages, r in t.items():
        sec.rows.append([f"F.linear at one row (MKL), weights in {pages} pages", ms(r["min"]), ms(r["median"]),
                         f"{nbytes / r['median'] / 1e9:.1f}"])
    sec.notes.append(f"{moved / 2**20:.0f} MiB of the copy were moved into 2 MiB pages (0: the kernel refused, "
                     "and the two rows differ by noise only).")
    return sec, t["2 MiB"]["median"]


def prefill_parts(static, t: int, repeats: int = 5) -> tuple[Section, float, float]:
    """-> (table, seconds of the weight GEMMs, seconds of causal attention) for a t-token prefill."""
    cfg = static.cfg
    weights = _step_weights(static)[:-1]  # the prefill computes the head at one position only
    xs = {k: torch.randn(t, k, dtype=weights[0].dtype) for k in {w.shape[1] for w in weights}}  # (t, k)
    q = torch.randn(1, cfg.n_heads, t, cfg.head_dim, dtype=weights[0].dtype)
    kv = torch.randn(1, cfg.n_kv_heads, t, cfg.head_dim, dtype=weights[0].dtype)
    gqa = cfg.n_kv_heads != cfg.n_heads

    def gemms():
        for w in weights:
            F.linear(xs[w.shape[1]], w)

    def attention():
        for _ in static.layers:
            F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=gqa)

    r = time_calls({"weight GEMMs": gemms, "causal attention": attention}, repeats=repeats, warmup=1)
    flops = 2 * t * sum(w.numel() for w in weights)
    sec = Section(f"Parts of a {t}-token {str(weights[0].dtype).removeprefix('torch.')} prefill, each timed on its own "
                  f"({len(static.layers)} layers)", ["part", "min ms", "median ms", "GFLOP/s (median)"])
    attn_flops = 2 * 2 * cfg.n_heads * t * t * cfg.head_dim / 2 * len(static.layers)  # QK^T and PV, causal half
    for name, kernel, f in (("weight GEMMs", "F.linear", flops),
                            ("causal attention", "F.scaled_dot_product_attention", attn_flops)):
        sec.rows.append([f"{name} ({kernel})", ms(r[name]["min"]), ms(r[name]["median"]),
                         f"{f / r[name]['median'] / 1e9:.0f}"])
    return sec, r["weight GEMMs"]["median"], r["causal attention"]["median"]
