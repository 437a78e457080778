import pytest
from kernel_builds import RUNS

from llamablock.fast.kernels import ggml_kernel


@pytest.fixture(scope="session")
def libs(tmp_path_factory):
    """Each build this CPU runs, compiled once for the whole run (a build takes seconds to tens of
    seconds of one core: built per test, the kernel tests were a sixth of the suite's time on AVX2)."""
    where = tmp_path_factory.mktemp("kernels")
    return {isa: ggml_kernel.load(where, isa) for isa in RUNS}
