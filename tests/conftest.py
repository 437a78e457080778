import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# `make test` runs one pytest-xdist worker per CPU: each worker takes its share of the cores, since two
# workers of two threads each on two cores make every multi-threaded call wait on the other's threads.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _workers)))
# Compiled graphs of the tests go to a fresh directory, not the user's cache (llamablock.fast.compiled.compile_cache),
# named by the pid: `llamablock cache --clear` removes one a killed run left (commands/cache.py).
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _inductor_dir = tempfile.mkdtemp(prefix=f"llamablock-inductor-{os.getpid()}-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _inductor_dir
    atexit.register(shutil.rmtree, _inductor_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    """Modules with a slow test first, each module's own order kept. pytest-xdist (`make test`,
    --dist loadscope --no-loadscope-reorder) hands out whole modules (and classes) in collection
    order: the long ones then start early and the short ones fill the end. Its default order, by
    test count, sent the one-test classes (the quick benchmark parts) last, to run alone."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)  # stable: each module's order kept
