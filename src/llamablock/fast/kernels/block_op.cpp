// llamablock::block_linear, the block kernel (ggml_dot.c) as a PyTorch operator, so that a compiled
// program (torch.export, AOTInductor) can call it: a ctypes call cannot be traced. Eager layers call
// the same C function through ctypes (fast/kernels/ggml_kernel.py); both give the same numbers.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

extern "C" int lb_linear(int type, const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                         int threads);

// x (..., k) any float dtype, blocks (n, k / 32 * block bytes) uint8 -> (..., n) float32
static at::Tensor block_linear(const at::Tensor &x, const at::Tensor &blocks, int64_t type) {
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
                "block_linear: blocks must be a contiguous 2-D uint8 tensor");
    const int64_t k = x.size(-1), n = blocks.size(0);
    at::Tensor x2 = x.reshape({-1, k}).to(at::kFloat).contiguous();
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = n;
    at::Tensor y = at::empty({x2.size(0), n}, x2.options());
    int status = lb_linear(static_cast<int>(type), blocks.data_ptr<uint8_t>(), n, k, x2.data_ptr<float>(), x2.size(0),
                           y.data_ptr<float>(), at::get_num_threads());
    TORCH_CHECK(status == 0, "block_linear: no memory for the kernel's copy of x");
    return y.reshape(shape);
}

TORCH_LIBRARY(llamablock, m) { m.def("block_linear(Tensor x, Tensor blocks, int type) -> Tensor"); }

TORCH_LIBRARY_IMPL(llamablock, CPU, m) { m.impl("block_linear", &block_linear); }
