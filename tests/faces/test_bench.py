"""The benchmark suite runs end to end in --quick form and prints its tables (no time is asserted)."""

from __future__ import annotations

import pytest
import torch

from llamablock import cli


def _quick(names: tuple[str, ...], tmp_path, capfd) -> str:
    """The report of `bench --quick NAMES`, checked: every section printed and written, the header, every
    table's rows as wide as its header, written atomically."""
    out = tmp_path / "BENCH.md"
    threads = torch.get_num_threads()
    try:
        assert cli.main(["bench", "--quick", "--threads", "1", *names, "--output", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capfd.readouterr().out
    report = out.read_text()
    for name in names:
        assert f"## {name}" in report and f"## {name}" in printed
    assert "torch " + torch.__version__ in report and "Load average" in report
    tables = report.split("\n### ")[1:]
    assert len(tables) >= len(names)
    for blk in tables:
        rows = [ln for ln in blk.splitlines() if ln.startswith("|")]
        assert len(rows) >= 3
        assert len({ln.count("|") for ln in rows}) == 1, blk
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary file left
    return report


# The quick suite in three parts of about equal time (each section's "_name: N s_" line in a quick
# run), one class each: `make test` (pytest-xdist, --dist loadscope) runs a class on one worker, so the
# parts run side by side instead of one test taking the longest share of the suite.
class _QuickPart:
    names: tuple[str, ...] = ()

    @pytest.mark.slow
    def test_prints_and_writes_every_table(self, tmp_path, capfd):
        self.check(_quick(self.names, tmp_path, capfd))

    def check(self, report: str) -> None:
        """What this part's report must hold beyond every section and table."""


class TestQuickCompiles(_QuickPart):
    names = ("compile_cache", "size", "startup", "attention", "norm", "rope", "swiglu", "train_step", "malloc",
             "prefill_crossover", "kquants", "build")


class TestQuickProcesses(_QuickPart):
    names = ("passkey", "memory", "overflow", "huge_pages", "activations", "cache_attention", "prompt_attention")


class TestQuickDecode(_QuickPart):
    names = ("decode", "file_blocks", "scaled_perplexity", "long_loss", "generate_command", "threads",
             "long_prefill", "serve")

    def check(self, report: str) -> None:
        # The decode table has the four llamablock formats; the profile names the packed int8 kernel.
        for fmt in ("float32", "bfloat16", "q8", "q4"):
            assert f"| llamablock {fmt} |" in report
        assert "_weight_int8pack_mm" in report


def test_the_quick_parts_run_every_benchmark_once():
    from benchmarks.runner import BENCHMARKS

    names = [n for part in (TestQuickCompiles, TestQuickProcesses, TestQuickDecode) for n in part.names]
    assert sorted(names) == sorted(BENCHMARKS)


def test_unknown_benchmark_is_a_usage_error(capfd):
    assert cli.main(["bench", "--quick", "nosuch"]) == 2
    err = capfd.readouterr().err
    assert "unknown benchmark nosuch" in err and "attention" in err


def test_tune_allocator_reports_what_it_did(monkeypatch):
    from llamablock.fast.kernels import malloc

    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    assert "left alone: the user set MALLOC_MMAP_MAX_" in malloc.tune_allocator()
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc_minimal.so.4")
    assert "another allocator" in malloc.tune_allocator()
    monkeypatch.delenv("LD_PRELOAD")
    state = malloc.tune_allocator()
    assert state.startswith("glibc mallopt: M_MMAP_MAX=0") or "not glibc" in state
    assert malloc.allocator_state() == state


@torch.no_grad()
def test_decode_limits_time_the_real_layers_of_a_static_layout():
    """benchmarks.decode_limits (used by the full decode benchmark only) on a tiny model: one row
    per int8 kernel over every Int8Linear of the layout, the float32 step's matrix-vector products,
    the prefill's parts, positive times."""
    import copy

    from benchmarks import decode_limits
    from llamablock.config import ModelConfig
    from llamablock.fast.compiled.static_decode import StaticDecoder
    from llamablock.fast.kernels.quant import quantize_model
    from llamablock.model import Decoder

    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=128)
    model = Decoder(cfg).eval()
    q8 = StaticDecoder(copy.deepcopy(model).to(torch.bfloat16), 64)
    quantize_model(q8, "q8")
    sec, nbytes, rate = decode_limits.int8_kernels(q8, repeats=1, stream_mib=8)
    assert nbytes == 2 * (64 * (64 + 2 * 32) + 64 * 64 + 2 * 128 * 64 + 64 * 128) + 256 * 64  # layers + head
    assert len(sec.rows) == 3 and all(float(r[1]) > 0 for r in sec.rows) and rate > 0
    static = StaticDecoder(model, 64)
    sec, gemv_s = decode_limits.float32_gemvs(static, repeats=1)
    assert "step's 9 weight matrix-vector products" in sec.title  # 4 per layer and the head
    assert [r[0].split(", ")[1] for r in sec.rows] == ["weights in 4 KiB pages", "weights in 2 MiB pages"] and gemv_s > 0
    sec, gemm_s, attn_s = decode_limits.prefill_parts(static, 32, repeats=1)
    assert [r[0].split(" (")[0] for r in sec.rows] == ["weight GEMMs", "causal attention"]
    assert gemm_s > 0 and attn_s > 0


def test_into_puts_a_run_of_a_few_benchmarks_in_place_of_their_old_sections(tmp_path, capfd):
    from benchmarks.runner import splice

    report = "\n".join(["# Benchmarks", "", "- Date: today", "- Command: `llamablock bench b d`", "",
                        "Absolute times move.", "", "## b", "", "Claim: b.", "", "### new b", "", "_b: 2 s_", "",
                        "## d", "", "Claim: d.", "", "### d's table", "", "_d: 1 s_", ""])
    old = "\n".join(["# Benchmarks", "", "- Date: long ago", "", "## a", "", "Claim: a.", "", "### a's table", "",
                     "## b", "", "Claim: b.", "", "### old b", "", "_b: 9 s_", "", "## c", "", "### c's table", ""])
    got = splice(report, old).splitlines()
    heads = [ln for ln in got if ln.startswith("#")]
    assert heads == ["# Benchmarks", "## a", "### a's table", "## b", "### new b", "## c", "### c's table", "## d",
                     "### d's table"]
    b = got[got.index("## b"):got.index("## c")]
    assert b[:8] == ["## b", "", "Claim: b.", "", "Run on its own (its own header):", "- Date: today",
                     "- Command: `llamablock bench b d`", ""]
    assert "- Date: long ago" in got and got.count("- Date: today") == 2 and "old b" not in "\n".join(got)
    assert splice(report, "\n".join(got)).splitlines() == got  # again: the same file
    alone = report[:report.index("## d")].rstrip("\n")  # b the last section of its run, a section after it here
    assert splice(alone, "\n".join(got)).splitlines() == got
    from benchmarks.runner import main

    assert main(["--quick", "--into", str(tmp_path / "nosuch.md"), "norm"]) == 2
    assert "--quick's tiny sizes stay out of a report" in capfd.readouterr().err


def test_a_per_cpu_kind_section_is_headed_by_the_kind_and_keeps_the_other_kinds(monkeypatch):
    """`size`'s targets hold per CPU kind: an AVX2 run goes beside the AMX one, not over it."""
    import types

    from benchmarks import runner
    from llamablock.util import cpu

    monkeypatch.setattr(cpu, "this_cpu", lambda: types.SimpleNamespace(kind="AVX2"))
    assert runner.heading("size", types.SimpleNamespace(PER_CPU_KIND=True)) == "size (AVX2)"
    assert runner.heading("norm", types.SimpleNamespace()) == "norm"
    import benchmarks.bench_size as size

    assert size.PER_CPU_KIND
    old = "\n".join(["# Benchmarks", "", "## size (AMX)", "", "Claim: s.", "", "### amx run", ""])
    report = "\n".join(["# Benchmarks", "", "- Date: today", "", "## size (AVX2)", "", "Claim: s.", "",
                        "### avx2 run", ""])
    got = runner.splice(report, old)
    assert "### amx run" in got and "### avx2 run" in got and got.index("## size (AMX)") < got.index("## size (AVX2)")


def test_size_gaps_give_the_change_that_meets_each_missed_target():
    """benchmarks/size_gaps.py by hand: a 10 ms step of which 8 ms is the kernel, at 0.8x its target,
    must take 8 ms, so the kernel 6 ms (8/6 = 1.33x faster); at 0.1x no kernel can (1 ms < 2 ms)."""
    from benchmarks.size_gaps import bandwidth_gap, memory_gap, rate_gap

    prof = {"step": 0.010, "kernel": 0.008, "attention": 0.001, "rest": 0.001}
    assert rate_gap("d", 1.0, 1.0, prof) is None
    assert "1.33x faster (8.0 -> 6.0 ms of a 10.0 ms step)" in rate_gap("d", 0.8, 1.0, prof)
    assert "no block kernel closes it" in rate_gap("d", 0.1, 1.0, prof)
    # 1 GiB in 8 ms against a 200 GiB/s read: 62.5%; at 85% the step takes 1 GiB / 170 GiB/s = 5.9 ms
    gib = 2**30
    got = bandwidth_gap("b", 0.5, 0.85, prof, gib, 200 * gib)
    assert "streams 62% of the plain read" in got and "takes 5.9 ms" in got
    assert bandwidth_gap("b", 0.9, 0.85, prof, gib, 200 * gib) is None
    assert "the kernel is fast enough" in bandwidth_gap("b", 0.4, 0.85, prof, gib, 100 * gib)  # alone: 125%
    assert "the miss is the runtime's floor" in memory_gap("m", 1.4, 1.1, 1.2, 219)
    assert "copies beyond the file" in memory_gap("m", 1.5, 1.3, 1.2, 219)
    assert memory_gap("m", 1.1, 1.0, 1.2, 219) is None
