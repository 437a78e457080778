// llamablock::block_linear, the block kernel (c/blocks.h lb_linear) as a PyTorch operator, so that a
// compiled program (torch.export, AOTInductor) can call it: a ctypes call cannot be traced. Eager
// layers call the same C function through ctypes (fast/kernels/ggml_kernel.py); both give the same
// numbers. `layout` is lb_linear's: 0 the file's order of rows, 1 groups of 8 rows (the types with
// that layout only, lb_block_groups).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "c/blocks.h"

// x2 (m, k) float32 W^T by GEMM_TILE weight rows at a time, each tile dequantized exactly (c/dequant.c)
// and multiplied by one float32 at::mm: ggml_kernel.py's _float_gemm, call for call, so that the
// compiled and the eager engines give the same numbers.
static constexpr int64_t GEMM_TILE = 256;  // ggml_kernel.GEMM_TILE

static at::Tensor float_gemm(const at::Tensor &x2, const at::Tensor &blocks, int type, int layout) {
    const int64_t n = blocks.size(0), k = x2.size(1);
    at::Tensor y = at::empty({x2.size(0), n}, x2.options());
    at::Tensor tile = at::empty({std::min(GEMM_TILE, n), k}, x2.options());
    for (int64_t i = 0; i < n; i += GEMM_TILE) {
        const int64_t rows = std::min(GEMM_TILE, n - i);
        int status = lb_dequantize(type, layout, blocks.data_ptr<uint8_t>(), n, k, i, i + rows, tile.data_ptr<float>(),
                                   at::get_num_threads());
        TORCH_CHECK(status == LB_OK, "block_linear: cannot dequantize GGML type ", type, " in layout ", layout);
        y.narrow(1, i, rows).copy_(at::mm(x2, tile.narrow(0, 0, rows).t()));
    }
    return y;
}

// x (..., k) any float dtype, blocks (n, k / weights * block bytes) uint8 -> (..., n) float32; from
// gemm_from rows of x on (0: never) a float GEMM over the dequantized rows (ggml_kernel.matmul's)
static at::Tensor block_linear(const at::Tensor &x, const at::Tensor &blocks, int64_t type, int64_t layout,
                               int64_t gemm_from) {
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
                "block_linear: blocks must be a contiguous 2-D uint8 tensor");
    const int64_t k = x.size(-1), n = blocks.size(0), weights = lb_block_weights(static_cast<int>(type));
    TORCH_CHECK(weights > 0, "block_linear: this library does not compute GGML type ", type);
    TORCH_CHECK(k % weights == 0 && blocks.size(1) == k / weights * lb_block_bytes(static_cast<int>(type)),
                "block_linear: rows of ", k, " weights do not match blocks of ", blocks.size(1), " bytes a row");
    at::Tensor x2 = x.reshape({-1, k}).to(at::kFloat).contiguous();
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = n;
    if (gemm_from > 0 && x2.size(0) >= gemm_from)
        return float_gemm(x2, blocks, static_cast<int>(type), static_cast<int>(layout)).reshape(shape);
    at::Tensor y = at::empty({x2.size(0), n}, x2.options());
    int status = lb_linear(static_cast<int>(type), static_cast<int>(layout), blocks.data_ptr<uint8_t>(), n, k,
                           x2.data_ptr<float>(), x2.size(0), y.data_ptr<float>(), at::get_num_threads());
    TORCH_CHECK(status != LB_NO_MEMORY, "block_linear: no memory for the kernel's copy of x");
    TORCH_CHECK(status != LB_UNKNOWN, "block_linear: no layout ", layout, " for GGML type ", type,
                " (0: the file's rows; 1: groups of 8 rows, where lb_block_groups says the type has them)");
    TORCH_CHECK(status == LB_OK, "block_linear: grouped rows come in groups of ", int(LB_GROUP), "; got ", n);
    return y.reshape(shape);
}

// A decode step's attention over a KV cache in float32, float16 or bfloat16 (c/cache_attention.c, which
// fast/kernels/cache_attention.py calls by ctypes for the eager engine): the compiled step reads its
// static cache in place through this, where products and sums over `keys.float()` read a long cache at
// a fraction of the memory's rate (`llamablock bench cache_attention`). One call a layer: q (b, h, hd)
// float32 against a cache buffer (b, n_kv, L, hd), its first n slots, n the last size of `allowed`
// (1 or b, 1, 1, n) bool, the slots each row may see -> (b, h, hd) float32. Scores (q . k) scale in C,
// the masked ones -inf, ATen's softmax (the one torch.softmax calls: the eager reader's), values in C.
static int cache_dtype(const at::Tensor &t) {
    switch (t.scalar_type()) {
        case at::kFloat: return LB_F32;
        case at::kHalf: return LB_F16;
        case at::kBFloat16: return LB_BF16;
        default: TORCH_CHECK(false, "cache attention: a cache of float32, float16 or bfloat16, not ", t.scalar_type());
    }
    return -1;
}

static at::Tensor cache_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                  const at::Tensor &allowed, double scale) {
    const int64_t n = allowed.size(-1);
    TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 3 && q.is_contiguous() && k.dim() == 4 &&
                    k.is_contiguous() && v.sizes() == k.sizes() && v.is_contiguous() &&
                    v.scalar_type() == k.scalar_type() && k.size(0) == q.size(0) && q.size(1) % k.size(1) == 0 &&
                    q.size(2) == k.size(3) && allowed.dim() == 4 && n >= 1 && n <= k.size(2) &&
                    (allowed.size(0) == 1 || allowed.size(0) == q.size(0)) && allowed.size(1) == 1 && allowed.size(2) == 1,
                "cache attention: q (b, h, hd) float32 contiguous against contiguous caches (b, n_kv, L, hd) of one "
                "dtype, h a multiple of n_kv, and `allowed` (1 or b, 1, 1, n), 1 <= n <= L");
    const int64_t b = q.size(0), h = q.size(1), hd = q.size(2), n_kv = k.size(1), L = k.size(2), g = h / n_kv;
    const int dtype = cache_dtype(k);
    const int64_t row = n_kv * L * hd * k.element_size();  // bytes of one row's cache
    at::Tensor scores = at::empty({b, h, n}, q.options());
    for (int64_t r = 0; r < b; r++) {
        int status = lb_cache_scores(dtype, q.data_ptr<float>() + r * h * hd, static_cast<const char *>(k.data_ptr()) + r * row,
                                     n_kv, g, hd, L * hd, n, static_cast<float>(scale),
                                     scores.data_ptr<float>() + r * h * n, at::get_num_threads());
        TORCH_CHECK(status == LB_OK, "cache attention: heads of a multiple of 16 features up to 512, at most 64 "
                    "queries a group");
    }
    // the slots a row may not see to -inf, in place: allowed (1 or b, 1, 1, n) bool over scores (b, h, n)
    const at::Tensor mask = allowed.to(at::kBool).contiguous();
    const bool *seen = mask.data_ptr<bool>();
    float *score = scores.data_ptr<float>();
    for (int64_t r = 0; r < b; r++) {
        const bool *row_seen = seen + (mask.size(0) == 1 ? 0 : r * n);
        for (int64_t i = 0; i < h; i++)
            for (int64_t j = 0; j < n; j++)
                if (!row_seen[j]) score[(r * h + i) * n + j] = -INFINITY;
    }
    at::Tensor probs = at::softmax(scores, -1);
    at::Tensor out = at::empty({b, h, hd}, q.options());
    for (int64_t r = 0; r < b; r++) {
        int status = lb_cache_values(dtype, probs.data_ptr<float>() + r * h * n,
                                     static_cast<const char *>(v.data_ptr()) + r * row, n_kv, g, hd, L * hd, n,
                                     out.data_ptr<float>() + r * h * hd, at::get_num_threads());
        TORCH_CHECK(status == LB_OK, "cache attention: no memory for the values' tiles");
    }
    return out;
}

// A prompt's causal attention in chunks of `chunk` queries, each kv group's query heads stacked into one
// matmul (fast/kernels/prompt_attention.py, whose chunked_causal the eager engine calls: the same ATen calls in
// the same order, so the same numbers), for a prompt of first..last tokens; any other length (or more
// keys than queries) takes torch's SDPA kernel, as a compiled program's one prefill serves every length.
// q (b, h, t, hd), k and v (b, n_kv, t, hd) float32 -> (b, h, t, hd) contiguous, either way (the layout
// the fake kernel in block_op.py promises the program).
static at::Tensor prompt_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double scale,
                                   int64_t chunk, int64_t first, int64_t last) {
    const int64_t b = q.size(0), h = q.size(1), t = q.size(2), hd = q.size(3), n_kv = k.size(1);
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && h % n_kv == 0 && chunk > 0,
                "prompt_attention: q (b, h, t, hd) and k, v (b, n_kv, t, hd) with h a multiple of n_kv");
    if (t < first || t > last || k.size(2) != t || q.scalar_type() != at::kFloat)
        return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, scale, n_kv != h).contiguous();
    const int64_t g = h / n_kv;
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor qg = at::mul(q, scale).view({b, n_kv, g, t, hd}), og = out.view({b, n_kv, g, t, hd});
    at::Tensor above = at::ones({chunk, chunk}, q.options().dtype(at::kBool)).triu_(1);  // key after query
    for (int64_t a = 0; a < t; a += chunk) {
        const int64_t e = std::min(a + chunk, t), c = e - a;
        at::Tensor scores = at::matmul(qg.slice(3, a, e).reshape({b, n_kv, g * c, hd}), k.slice(2, 0, e).transpose(-1, -2));
        scores.view({b, n_kv, g, c, e}).slice(4, a, e).masked_fill_(above.slice(0, 0, c).slice(1, 0, c), -INFINITY);
        og.slice(3, a, e).copy_(at::matmul(at::softmax(scores, -1), v.slice(2, 0, e)).view({b, n_kv, g, c, hd}));
    }
    return out;
}

TORCH_LIBRARY(llamablock, m) {
    m.def("block_linear(Tensor x, Tensor blocks, int type, int layout=0, int gemm_from=0) -> Tensor");
    m.def("cache_attention(Tensor q, Tensor k, Tensor v, Tensor allowed, float scale) -> Tensor");
    m.def("prompt_attention(Tensor q, Tensor k, Tensor v, float scale, int chunk, int first, int last) -> Tensor");
}

TORCH_LIBRARY_IMPL(llamablock, CPU, m) {
    m.impl("block_linear", &block_linear);
    m.impl("cache_attention", &cache_attention);
    m.impl("prompt_attention", &prompt_attention);
}
