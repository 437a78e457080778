"""What cannot build, or must not run, on this machine falls back, one line each, never a traceback.

The block kernel's C library: the widest build the CPU runs (best_isa), a compiler without OpenMP
or a broken one, a library whose block table disagrees with the gguf package's (refused), and its
cache of old builds. A compiled engine's settings: the missing template is simulated the way an
AVX2 CPU without AVX-512 meets it: inductor's own check for a C++ GEMM template answers no for the
int4 matmul (`use_cpp_gemm_template`, read by its int4 lowering at each call), so the autotuned
settings restricted to the templates end in inductor's real NoValidChoicesError, as they do there
(`ATEN_CPU_CAPABILITY=avx2` on an AVX-512 machine shows the same error). Reference for the tokens:
the eager Decoder, greedy; for the kernel's table, gguf.GGML_QUANT_SIZES.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from types import SimpleNamespace

import gguf
import pytest
import torch
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

import llamablock
from llamablock import cli
from llamablock.fast import machine
from llamablock.fast.compiled import aoti_step, builds
from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.compiled.build_options import attempts, inductor_options
from llamablock.fast.kernels import block_op, build, ggml_kernel
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate
from llamablock.util import cpu

PROMPT = [5, 17, 3, 88, 42, 9, 61]


def _no_int4_template(monkeypatch):
    """Inductor finds no C++ GEMM template for the int4 matmul (its packed weight is uint8)."""
    import torch._inductor.lowering  # first: importing the lowerings module on its own is circular
    import torch._inductor.quantized_lowerings as lowerings

    real = lowerings.use_cpp_gemm_template

    def check(layout, mat1, mat2, *args, **kwargs):
        return False if mat2.get_dtype() == torch.uint8 else real(layout, mat1, mat2, *args, **kwargs)

    monkeypatch.setattr(lowerings, "use_cpp_gemm_template", check)


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # no package or marker of another test


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=256).save_pretrained(d)
    return d


def test_attempts_go_from_the_templates_to_inductors_defaults():
    names = [a.name for a in attempts("q4", "step", cpu_kind="AVX-512")]
    assert names == ["autotuned C++ GEMM templates", "autotuned, ATen's GEMMs beside the templates",
                     "inductor's default kernels"]
    assert [a.name for a in attempts("q4", "step", autotune=False)] == ["inductor's default kernels"]
    # float32's step already leaves the templates for MKL, and the prefill already has ATen beside them
    assert len(attempts("float32", "step", cpu_kind="AMX")) == 2 and len(attempts("q4", "prefill", cpu_kind="AMX")) == 2
    assert attempts("q4", "step", cpu_kind="AMX")[-1].options == inductor_options(False)


@pytest.mark.parametrize("kind", ["AMX", "AVX-512", "AVX2", "NEON", "other"])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "q8", "q4"])
def test_the_first_attempt_per_cpu_kind(kind, fmt):
    """Only q4 on a CPU without inductor's int4 templates (they exist for AVX-512 and AMX) skips
    the templates-only settings, and says why; every other format and CPU starts as tuned."""
    first = attempts(fmt, "step", cpu_kind=kind)[0]
    if fmt == "q4" and kind not in ("AMX", "AVX-512"):
        assert first.name == "autotuned, ATen's GEMMs beside the templates" and kind in first.why
        assert first.options["max_autotune_gemm_backends"] == "CPP,ATEN"
    else:
        assert first == attempts(fmt, "step", cpu_kind="AMX")[0] and first.why == ""


@torch.no_grad()
def test_when_nothing_builds_the_static_layout_runs_eagerly(tiny_dir, monkeypatch):
    def fail(self, static, options):
        raise RuntimeError("simulated: no kernel for this CPU")

    monkeypatch.setattr(aoti_step.AOTIProgram, "_compile", fail)
    model = llamablock.load_pretrained(tiny_dir)
    lines = []
    engine = AOTIEngine(model, "float32", notify=lines.append)
    tokens = generate(engine, PROMPT, max_new_tokens=8).tokens
    assert engine.running == {"step": "eager", "prefill": "eager"} and engine.packages() == []
    assert len(lines) == len(attempts("float32", "step")) + len(attempts("float32", "prefill"))
    assert all("simulated: no kernel" in line for line in lines) and "run eagerly" in lines[1]
    assert tokens == generate(EagerEngine(model), PROMPT, max_new_tokens=8).tokens
    # A later process: the failures are remembered beside the packages, said briefly, not compiled again.
    later = []
    again = AOTIEngine(model, "float32", notify=later.append)
    assert generate(again, PROMPT, max_new_tokens=8).tokens == tokens
    assert len(later) == len(lines) and all("failed to build here before" in line for line in later)


@pytest.mark.slow
def test_compile_with_a_missing_template_then_generate_loads_it(tmp_path, monkeypatch, capsys):
    """`llamablock compile` says in one line what failed and what was built instead, records it,
    and the plain `generate` then loads that build: nothing compiled in the foreground."""
    _no_int4_template(monkeypatch)
    # a CPU that inductor has int4 templates for, so the templates are tried (and fail, simulated), where
    # the file's blocks are re-quantized into q4, as tested here
    monkeypatch.setattr(cpu, "this_cpu", lambda: cpu.cpu_from({"avx512_f": True}, "AVX512"))
    no_kernel = machine.machine_for(cpu.this_cpu(), kernel=False, why_not="turned off by the test")
    monkeypatch.setattr(machine, "this_machine", lambda: no_kernel)
    f = tmp_path / "tiny-q4.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64,
                                     hidden_size=64, intermediate_size=128), qtype="Q4_0")
    assert cli.main(["compile", "--model", str(f), "--tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert out.count("cannot be built with autotuned C++ GEMM templates") == 1 and "done: q4, compiled (autotuned, ATen's GEMMs" in out
    assert "Traceback" not in out and builds.built_length(f, "q4") == 64
    compiled = []
    real = aoti_step.AOTIProgram._compile
    monkeypatch.setattr(aoti_step.AOTIProgram, "_compile", lambda *a: (compiled.append(a), real(*a)))
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc", "--max-new-tokens", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)  # a later process: the failed settings are not tried again
    assert result["weights"].startswith("q4, compiled (autotuned, ATen's GEMMs") and compiled == []
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc", "--max-new-tokens", "4", "--json",
                     "--engine", "eager"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == result["tokens"]  # the eager q4 model's greedy tokens


@pytest.mark.slow
def test_a_build_without_autotune_is_what_generate_loads(tmp_path, monkeypatch, capsys):
    """`compile --no-autotune` records its setting, and a request shorter than the build runs on the
    built cache: generate loads the packages built instead of compiling others in the foreground
    (autotuned ones, or ones for the smallest cache, 256, when 512 were built)."""
    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=1024))
    assert cli.main(["compile", "--model", str(f), "--tokens", "512", "--no-autotune"]) == 0
    assert not builds.autotuned(f, "float32")
    capsys.readouterr()
    compiled = []
    monkeypatch.setattr(aoti_step.AOTIProgram, "_compile", lambda *a: compiled.append(a))
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc", "--max-new-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weights"] == "float32, compiled" and compiled == []


AVX512_CAPS = {"avx2": True, "fma3": True, "f16c": True, "avx512_f": True, "avx512_bw": True, "avx512_vl": True}


@pytest.mark.parametrize("isa, caps, want", [
    ("AVX512", AVX512_CAPS, "avx512"),
    ("AVX512", {**AVX512_CAPS, "avx512_vnni": True}, "avx512vnni"),
    ("AVX2", {**AVX512_CAPS, "avx512_vnni": True}, "avx2"),  # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine
    ("AVX2", AVX512_CAPS, "avx2"),  # as on an AVX2 one
    ("AVX512", {**AVX512_CAPS, "avx512_bw": False}, "avx2"),  # AVX-512 F without BW (Knights Landing)
    ("AVX2", {"avx2": True, "fma3": True, "f16c": True}, "avx2"),
    ("AVX2", {"avx2": True, "fma3": False, "f16c": True}, "portable"),  # no FMA: the AVX2 build would fault
    ("DEFAULT", {"architecture": "aarch64"}, "portable"),
])
def test_the_build_follows_the_cpu(isa, caps, want):
    assert ggml_kernel.best_isa(cpu.cpu_from(caps, isa), caps) == want
    assert "-mavx512vnni" in ggml_kernel.flags("avx512vnni") and "-mavx512vnni" not in ggml_kernel.flags("avx512")


def test_builds_of_old_sources_unused_for_weeks_are_deleted(tmp_path):
    """Every edit of the kernel and every release leaves a library behind in the user's cache: the
    same flags' builds unused for UNUSED_DAYS go, recent ones (another installed version's) and other
    flags' stay, and the build in use is marked used."""
    old = time.time() - (ggml_kernel.UNUSED_DAYS + 1) * 86400
    stale = ["f1-stale", "f2-stale", "0123456789abcdef", "f1-current"]  # the third: a name from before flavours
    files = {name: tmp_path / f"ggml_dot-{name}.so" for name in [*stale, "f1-recent"]}
    for name, f in files.items():
        f.write_bytes(b"")
        if name in stale:
            os.utime(f, (old, old))
    path = ggml_kernel.kept_build(tmp_path, "ggml_dot", "f1", "current")
    assert path == files["f1-current"] and time.time() - path.stat().st_mtime < 60
    assert {f.name for f in tmp_path.iterdir()} == {"ggml_dot-f1-recent.so", "ggml_dot-f2-stale.so",
                                                    "ggml_dot-f1-current.so"}


def _q8_blocks(n: int, k: int) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)).numpy()
    return torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0).copy())


def test_a_compiler_without_openmp_builds_the_one_thread_kernel(tmp_path, monkeypatch):
    """Apple's clang has no -fopenmp: the kernel is built without it, and computes the same."""
    fake = tmp_path / "cc-without-openmp"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && exit 1; done\nexec {shutil.which("cc")} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    lib = ggml_kernel.load(tmp_path / "k")
    assert len(list((tmp_path / "k").glob("*.so"))) == 1
    raw, x = _q8_blocks(16, 64), torch.randn(2, 64)
    assert torch.equal(ggml_kernel.matmul("Q8_0", raw, x, lib=lib), ggml_kernel.matmul("Q8_0", raw, x))


def test_a_broken_compiler_is_one_reason_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    with pytest.raises(RuntimeError, match="no output"):
        ggml_kernel.load(tmp_path / "k")
    assert not list((tmp_path / "k").glob("*.so"))  # nothing half written


def test_a_library_whose_block_table_disagrees_is_refused(tmp_path, monkeypatch):
    """A block size out of step between the C table and gguf's would read every row at the wrong
    bytes: such a library is refused, by both bindings, with the type and both sizes in the reason."""
    wrong_c = SimpleNamespace(lb_block_weights=lambda t: 32, lb_block_bytes={2: 18, 3: 20, 8: 36}.get)  # Q8_0 off
    with pytest.raises(build.Unusable, match=r"Q8_0 blocks are 36 bytes of 32 weights there, 34 bytes of 32 in gguf"):
        ggml_kernel.check_table(wrong_c)
    monkeypatch.setitem(ggml_kernel.SIZES, "Q8_0", (32, 36))  # a gguf that says otherwise than blocks.h
    with pytest.raises(build.Unusable, match=r"Q8_0 blocks are 34 bytes of 32 weights there, 36 bytes of 32 in gguf"):
        ggml_kernel.load(tmp_path)
    monkeypatch.setattr(ggml_kernel, "_why_not", [])
    ggml_kernel.kernel.cache_clear()
    try:
        assert ggml_kernel.kernel() is None
        assert ggml_kernel.why_not().startswith("the block kernel is unusable (its block table disagrees"), \
            ggml_kernel.why_not()
    finally:
        ggml_kernel.kernel.cache_clear()  # built again, on the true table, when next asked for
    monkeypatch.setattr(block_op, "_why_not", [])
    assert block_op.load.__wrapped__() is False  # checked before the operator is registered
    assert block_op._why_not[-1].startswith("the block operator is unusable (its block table disagrees")
