"""fast/kernels/malloc.py's loading mode, in a child process (the allocator's settings are process-wide).

Reference: glibc's mallinfo2(3), whose `hblkhd` counts the bytes of blocks that have their own
mapping; `tune_allocator` turns such mappings off, `mapped_large_blocks` back on for its block.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, json
from llamablock.fast.kernels import malloc

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = malloc._glibc()
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def own_mapping():  # whether a fresh 64 MiB block gets its own mapping
    before = libc.mallinfo2().hblkhd
    p = libc.malloc(64 << 20)
    mapped = libc.mallinfo2().hblkhd > before
    libc.free(p)
    return mapped

assert malloc.tune_allocator().startswith("glibc mallopt")
with malloc.mapped_large_blocks():
    inside = own_mapping()
print(json.dumps([inside, own_mapping()]))
"""


def test_large_blocks_are_mapped_only_within_the_loading_block():
    from llamablock.fast.kernels import malloc

    libc = malloc._glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("needs glibc 2.33 or later (mallinfo2)")
    env = {"PATH": "/usr/bin:/bin"}  # no MALLOC_ variables: tune_allocator applies its settings
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [True, False]  # mapped inside; heap again after
