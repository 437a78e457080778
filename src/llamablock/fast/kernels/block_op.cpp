// llamablock::block_linear, the block kernel (c/blocks.h lb_linear) as a PyTorch operator, so that a
// compiled program (torch.export, AOTInductor) can call it: a ctypes call cannot be traced. Eager
// layers call the same C function through ctypes (fast/kernels/ggml_kernel.py); both give the same
// numbers. `layout` is lb_linear's: 0 the file's order of rows, 1 groups of 8 rows (the types with
// that layout only, lb_block_groups).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "c/blocks.h"

// x (..., k) any float dtype, blocks (n, k / weights * block bytes) uint8 -> (..., n) float32
static at::Tensor block_linear(const at::Tensor &x, const at::Tensor &blocks, int64_t type, int64_t layout) {
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
                "block_linear: blocks must be a contiguous 2-D uint8 tensor");
    const int64_t k = x.size(-1), n = blocks.size(0), weights = lb_block_weights(static_cast<int>(type));
    TORCH_CHECK(weights > 0, "block_linear: this library does not compute GGML type ", type);
    TORCH_CHECK(k % weights == 0 && blocks.size(1) == k / weights * lb_block_bytes(static_cast<int>(type)),
                "block_linear: rows of ", k, " weights do not match blocks of ", blocks.size(1), " bytes a row");
    at::Tensor x2 = x.reshape({-1, k}).to(at::kFloat).contiguous();
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = n;
    at::Tensor y = at::empty({x2.size(0), n}, x2.options());
    int status = lb_linear(static_cast<int>(type), static_cast<int>(layout), blocks.data_ptr<uint8_t>(), n, k,
                           x2.data_ptr<float>(), x2.size(0), y.data_ptr<float>(), at::get_num_threads());
    TORCH_CHECK(status != LB_NO_MEMORY, "block_linear: no memory for the kernel's copy of x");
    TORCH_CHECK(status != LB_UNKNOWN, "block_linear: no layout ", layout, " for GGML type ", type,
                " (0: the file's rows; 1: groups of 8 rows, where lb_block_groups says the type has them)");
    TORCH_CHECK(status == LB_OK, "block_linear: grouped rows come in groups of ", int(LB_GROUP), "; got ", n);
    return y.reshape(shape);
}

TORCH_LIBRARY(llamablock, m) { m.def("block_linear(Tensor x, Tensor blocks, int type, int layout=0) -> Tensor"); }

TORCH_LIBRARY_IMPL(llamablock, CPU, m) { m.impl("block_linear", &block_linear); }
