// llamablock::block_linear, the block kernel (c/blocks.h lb_linear) as a PyTorch operator, so that a
// compiled program (torch.export, AOTInductor) can call it: a ctypes call cannot be traced. Eager
// layers call the same C function through ctypes (fast/kernels/ggml_kernel.py); both give the same
// numbers. `layout` is lb_linear's: 0 the file's order of rows, 1 groups of 8 rows (the types with
// that layout only, lb_block_groups).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

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

// The decode step's attention over a KV cache in float32, float16 or bfloat16 (c/cache_attention.c, which
// fast/kernels/cache_attention.py calls by ctypes for the eager engine): the compiled step reads its
// static cache in place through these, the cache's first n slots of each row, where products and
// sums over `keys.float()` read a long cache at a fraction of the memory's rate (`llamablock bench
// cache_attention`). q (b, h, hd) float32 and a cache buffer (b, n_kv, L, hd) -> scores (b, h, n)
// float32, (q . k) scale; weights p (b, h, n) float32 and the buffer -> (b, h, hd) float32.
static int cache_dtype(const at::Tensor &t) {
    switch (t.scalar_type()) {
        case at::kFloat: return 0;
        case at::kHalf: return 1;
        case at::kBFloat16: return 2;
        default: TORCH_CHECK(false, "cache attention: a cache of float32, float16 or bfloat16, not ", t.scalar_type());
    }
    return -1;
}

static void check_cache(const at::Tensor &rows, const at::Tensor &cache, int64_t n, const char *what) {
    TORCH_CHECK(rows.scalar_type() == at::kFloat && rows.dim() == 3 && rows.is_contiguous() && cache.dim() == 4 &&
                    cache.is_contiguous() && cache.size(0) == rows.size(0) && rows.size(1) % cache.size(1) == 0 &&
                    n >= 1 && n <= cache.size(2),
                "cache attention: ", what, " (b, h, ...) float32 contiguous against a contiguous cache (b, n_kv, L, hd), "
                "h a multiple of n_kv, 1 <= n <= L");
}

static at::Tensor cache_scores(const at::Tensor &q, const at::Tensor &k, int64_t n, double scale) {
    check_cache(q, k, n, "q");
    TORCH_CHECK(q.size(2) == k.size(3), "cache attention: q and the keys differ in width");
    const int64_t b = q.size(0), h = q.size(1), hd = q.size(2), n_kv = k.size(1), L = k.size(2);
    at::Tensor scores = at::empty({b, h, n}, q.options());
    for (int64_t r = 0; r < b; r++) {
        int status = lb_cache_scores(cache_dtype(k), q.data_ptr<float>() + r * h * hd,
                                     static_cast<const char *>(k.data_ptr()) + r * n_kv * L * hd * k.element_size(),
                                     n_kv, h / n_kv, hd, L * hd, n, static_cast<float>(scale),
                                     scores.data_ptr<float>() + r * h * n, at::get_num_threads());
        TORCH_CHECK(status == LB_OK, "cache attention: heads of a multiple of 16 features up to 512, at most 64 "
                    "queries a group");
    }
    return scores;
}

static at::Tensor cache_values(const at::Tensor &p, const at::Tensor &v) {
    const int64_t n = p.size(2);
    check_cache(p, v, n, "p");
    const int64_t b = p.size(0), h = p.size(1), n_kv = v.size(1), L = v.size(2), hd = v.size(3);
    at::Tensor out = at::empty({b, h, hd}, p.options());
    for (int64_t r = 0; r < b; r++) {
        int status = lb_cache_values(cache_dtype(v), p.data_ptr<float>() + r * h * n,
                                     static_cast<const char *>(v.data_ptr()) + r * n_kv * L * hd * v.element_size(),
                                     n_kv, h / n_kv, hd, L * hd, n, out.data_ptr<float>() + r * h * hd,
                                     at::get_num_threads());
        TORCH_CHECK(status != LB_NO_MEMORY, "cache attention: no memory for the values' tiles");
        TORCH_CHECK(status == LB_OK, "cache attention: heads of a multiple of 16 features up to 512, at most 64 "
                    "queries a group");
    }
    return out;
}

TORCH_LIBRARY(llamablock, m) {
    m.def("block_linear(Tensor x, Tensor blocks, int type, int layout=0, int gemm_from=0) -> Tensor");
    m.def("cache_scores(Tensor q, Tensor k, SymInt n, float scale) -> Tensor");
    m.def("cache_values(Tensor p, Tensor v) -> Tensor");
}

TORCH_LIBRARY_IMPL(llamablock, CPU, m) {
    m.impl("block_linear", &block_linear);
    m.impl("cache_scores", &cache_scores);
    m.impl("cache_values", &cache_values);
}
