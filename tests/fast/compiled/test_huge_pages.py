"""llamablock.fast.compiled.huge_pages: 2 MiB pages under given memory, and finding a library's allocations."""

from __future__ import annotations

import mmap
import re
from pathlib import Path

import pytest
import torch

from llamablock.fast.compiled.huge_pages import HUGE, collapse, huge_bytes, tensor_ranges

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    found = re.search(r"\[(\w+)\]", THP.read_text()) if THP.exists() else None
    return found.group(1) if found else None


def test_collapse_moves_a_buffer_into_huge_pages():
    if _thp_mode() in (None, "never"):
        pytest.skip(f"transparent huge pages are unavailable here ({THP}: {_thp_mode()})")
    buf = mmap.mmap(-1, 8 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    t = torch.frombuffer(buf, dtype=torch.uint8)
    t.fill_(7)  # faulted in as 4 KiB pages: nothing asked for more
    start = t.data_ptr()
    before = huge_bytes()
    done = collapse([(start, start + t.numel())])
    if done == 0:
        pytest.skip("the kernel refused MADV_COLLAPSE (older than Linux 6.1, or no free 2 MiB pages)")
    # mmap gives a 4 KiB-aligned start: the whole 2 MiB pages inside are 7 or 8 of them
    assert done in (7 * HUGE, 8 * HUGE)
    assert huge_bytes() - before >= done
    assert bool((t == 7).all())  # the contents moved with the pages
    assert collapse([(start, start + HUGE - 1)]) == 0 and collapse([(start, start)]) == 0  # no whole page inside


def test_tensor_ranges_cover_strided_and_onednn_tensors_and_merge_neighbours():
    base = torch.zeros(1000)
    parts = [base[:100], base[100:300], base[600:700]]  # two touching views, then a gap
    start = base.data_ptr()
    assert tensor_ranges(parts) == [(start, start + 1200), (start + 2400, start + 2800)]
    column = base.view(100, 10)[:, 3]  # strided: from element 3 to element 993
    assert tensor_ranges([column]) == [(start + 12, start + 3976)]
    packed = torch.randn(64, 64).to_mkldnn()  # opaque: no data_ptr(), oneDNN's own pointer and size
    ((lo, hi),) = tensor_ranges([packed])
    assert hi - lo == torch.ops.mkldnn._nbytes(packed) >= 64 * 64 * 4
    assert tensor_ranges([torch.zeros(0)]) == []


@torch.no_grad()
def test_the_compiled_steps_weights_move_into_huge_pages_and_give_the_same_logits():
    """AOTIProgram finds the block its library copied the weights into (16 MiB of embedding and
    head here, some as oneDNN tensors) and collapses it; a second engine loads the same package
    without huge pages."""
    if _thp_mode() in (None, "never"):
        pytest.skip(f"transparent huge pages are unavailable here ({THP}: {_thp_mode()})")
    from llamablock.config import ModelConfig
    from llamablock.fast.compiled.aoti_engine import AOTIEngine
    from llamablock.model import Decoder

    cfg = ModelConfig(vocab_size=16384, d_model=128, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=256,
                      tie_embeddings=False)
    model = Decoder(cfg).eval()
    engines = [AOTIEngine(model, autotune=False, compile_prefill=False, huge_pages=h) for h in (True, False)]
    ids = torch.arange(1, 9)[None]
    logits = []
    for engine in engines:
        engine.prefill(ids)
        logits.append(engine.step(torch.tensor([[3]]), 8))
    with_huge, without = (e._step_program for e in engines)
    if with_huge.huge_page_bytes == 0:
        pytest.skip("the kernel refused MADV_COLLAPSE (older than Linux 6.1, or no free 2 MiB pages)")
    weight_bytes = 2 * 16384 * 128 * 4  # embedding and head, float32
    assert weight_bytes - 2 * HUGE <= with_huge.huge_page_bytes and without.huge_page_bytes == 0
    assert without.compile_seconds == 0  # the same package, loaded
    assert torch.equal(logits[0], logits[1])
