import pytest
from kernel_builds import RUNS

from llamablock.fast.kernels import ggml_kernel


@pytest.fixture(scope="session")
def libs(tmp_path_factory):
    """Each build this CPU runs, compiled once for the whole run: a build takes seconds of one core,
    and built per test it was most of the kernel tests' time (pytest --durations)."""
    where = tmp_path_factory.mktemp("kernels")
    return {isa: ggml_kernel.load(where, isa) for isa in RUNS}
