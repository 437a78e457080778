"""The block kernel's builds this CPU runs (fast/kernels/build.py ISAS: the best one and the weaker
ones after it), for the kernel tests' parameters; tests/fast/kernels/conftest.py's `libs` builds each once."""

from llamablock.fast.kernels import ggml_kernel

RUNS = list(ggml_kernel.ISAS)[list(ggml_kernel.ISAS).index(ggml_kernel.best_isa()):]
