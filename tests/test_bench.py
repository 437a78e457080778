"""The benchmark suite runs end to end in --quick form and prints its tables (no time is asserted)."""

from __future__ import annotations

import pytest
import torch

from llamablock import cli


@pytest.mark.slow
def test_bench_quick_prints_and_writes_every_table(tmp_path, capsys):
    out = tmp_path / "BENCH.md"
    threads = torch.get_num_threads()
    try:
        assert cli.main(["bench", "--quick", "--threads", "1", "--output", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    report = out.read_text()
    for name in ("attention", "norm", "rope", "swiglu", "train_step", "malloc", "decode", "long_prefill", "compile_cache"):
        assert f"## {name}" in report and f"## {name}" in printed
    assert "torch " + torch.__version__ in report and "Load average" in report
    # Every table row has as many cells as its header.
    tables = report.split("\n### ")[1:]
    assert len(tables) >= 8
    for blk in tables:
        rows = [ln for ln in blk.splitlines() if ln.startswith("|")]
        assert len(rows) >= 3
        assert len({ln.count("|") for ln in rows}) == 1, blk
    # The decode table has the four llamablock formats; the profile names the packed int8 kernel.
    for fmt in ("float32", "bfloat16", "q8", "q4"):
        assert f"| llamablock {fmt} |" in report
    assert "_weight_int8pack_mm" in report
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary file left


def test_unknown_benchmark_is_a_usage_error(capsys):
    assert cli.main(["bench", "--quick", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark nosuch" in err and "attention" in err


def test_bad_threads_is_a_usage_error(capsys):
    assert cli.main(["bench", "--quick", "--threads", "0", "norm"]) == 2
    assert "--threads must be at least 1" in capsys.readouterr().err


def test_tune_allocator_reports_what_it_did(monkeypatch):
    from llamablock import malloc

    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    assert "left alone: the user set MALLOC_MMAP_MAX_" in malloc.tune_allocator()
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc_minimal.so.4")
    assert "another allocator" in malloc.tune_allocator()
    monkeypatch.delenv("LD_PRELOAD")
    state = malloc.tune_allocator()
    assert state.startswith("glibc mallopt: M_MMAP_MAX=0") or "not glibc" in state
    assert malloc.allocator_state() == state
