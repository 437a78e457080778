"""A compiled package in the cache is checked before it is loaded (fast/compiled/package_check.py).

A package's library cut short (a full disk, a kill while unpacking) is mapped past its end and the
first call dies of SIGBUS with no message. Every compile and load here runs in a child process: a
truncated library mapped in a live process faults when touched, even at its exit, so the pytest
process itself never loads one.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock.fast.compiled import package_check
from llamablock.fast.kernels import build

RUN = r"""
import sys
from llamablock.fast.compiled import aoti_step, builds
from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.machine import this_machine
from llamablock.fast.plan import load_gguf_native
from llamablock.runtime.generate import generate
model, _ = load_gguf_native(sys.argv[1], engine="compiled")
weights_id = builds.weights_identity(sys.argv[1], "blocks", this_machine().grouped)
engine = AOTIEngine(model, "blocks", autotune=False, weights_id=weights_id)
tokens = generate(engine, [5, 17, 3, 88, 42, 9, 61], 8).tokens
print(engine.compile_seconds > 0, ",".join(map(str, tokens)))
"""


@pytest.mark.slow
def test_a_package_cut_short_is_compiled_again_instead_of_loaded(tmp_path):
    """The second process finds a package's library truncated: it says so in one line, compiles the
    package again and gets the same tokens, where loading it would die of SIGBUS (-7)."""
    f = tmp_path / "Q4_1.gguf"
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16)
    write_tiny_gguf(f, hf, qtype="Q4_1")
    cache = tmp_path / "cache"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}

    def run():
        return subprocess.run([sys.executable, "-c", RUN, str(f)], env=env, capture_output=True, text=True)

    first = run()
    assert first.returncode == 0, first.stderr[-2000:]
    libraries = sorted((cache / "llamablock-aoti").glob("*/*/data/aotinductor/model/*.so"))
    assert libraries
    with open(libraries[0], "r+b") as library:
        library.truncate(4096)
    second = run()
    assert second.returncode == 0, (second.returncode, second.stderr[-2000:])
    said = [line for line in second.stderr.splitlines() if "is damaged" in line]
    assert len(said) == 1 and str(libraries[0]) in said[0] and "compiling it again" in said[0], second.stderr[-2000:]
    assert first.stdout.split()[-2:] == ["True", first.stdout.split()[-1]]
    assert second.stdout.split()[-2:] == ["True", first.stdout.split()[-1]]  # compiled again, same tokens


def _package(tmp_path):
    """A stand-in for an unpacked package: a library and the files beside it."""
    model = tmp_path / "pkg" / "package" / "data" / "aotinductor" / "model"
    model.mkdir(parents=True)
    (model / "w.wrapper.so").write_bytes(b"\x7fELF" + bytes(10000))
    (model / "w.wrapper.cpp").write_text("// source\n")
    return tmp_path / "pkg", model / "w.wrapper.so"


def test_a_recorded_package_checks_out_and_one_cut_short_is_set_aside(tmp_path, capsys):
    package, library = _package(tmp_path)
    assert package_check.mapped_files(package) == [library]  # the source is not what a load maps
    assert package_check.damaged_package(package) == (library, build.UNRECORDED)
    package_check.record_package(package)
    assert package_check.set_aside_package(package) is None and library.exists()  # intact: untouched
    assert capsys.readouterr().err == ""
    with open(library, "r+b") as f:
        f.truncate(4096)
    assert package_check.set_aside_package(package) is None
    assert not library.exists() and library.with_name(library.name + ".damaged").exists()
    assert not build.record_file(library).exists()
    [line] = capsys.readouterr().err.splitlines()
    assert str(library) in line and "is damaged" in line and "compiling it again" in line


def test_garbage_of_the_right_size_is_not_loaded(tmp_path, capsys):
    """The size check alone passes a library overwritten in place; its first bytes are not ELF's, and
    the loader would refuse it with a traceback."""
    package, library = _package(tmp_path)
    package_check.record_package(package)
    library.write_bytes((b"not a library " * 1000)[:library.stat().st_size])
    assert package_check.damaged_package(package) == (library, "it is not a shared library (its first bytes are not "
                                                               "ELF's)")
    assert package_check.set_aside_package(package) is None
    assert not library.exists() and library.with_name(library.name + ".damaged").exists()
    assert not build.record_file(library).exists()
    [line] = capsys.readouterr().err.splitlines()
    assert str(library) in line and "is damaged" in line and "compiling it again" in line


def test_a_damaged_package_that_cannot_be_moved_aside_is_refused(tmp_path, monkeypatch, capsys):
    """A read-only cache: nothing can be moved or deleted, so the package is neither loaded nor set aside."""
    package, library = _package(tmp_path)
    package_check.record_package(package)
    library.write_bytes(b"another library")

    def refuse(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(build.os, "replace", refuse)
    monkeypatch.setattr(type(library), "unlink", refuse)
    why = package_check.set_aside_package(package)
    assert why is not None and "cannot be moved aside" in why and library.exists()
    assert capsys.readouterr().err == ""


def test_a_damaged_build_is_not_offered_to_generate_which_runs_eagerly_and_says_so(tmp_path, monkeypatch, capsys):
    """The builds index counts a build only while its packages check out: `generate --engine auto` then
    runs the eager model with one line saying how to rebuild, where it used to set the library aside and
    compile for minutes in the foreground."""
    from llamablock.fast.compiled import builds
    from llamablock.fast.machine import this_machine
    from llamablock.fast.plan import decide
    from llamablock.io.source import ModelSource
    from llamablock.presets import preset

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(builds, "_said", set())
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    stored = {"token_embd.weight": "F32", "output.weight": "F32", "blk.0.attn_q.weight": "F32"}
    source = ModelSource(None, model, "gguf", preset("llama-2024-small", max_seq_len=64), stored, where="model.gguf")
    package, library = _package(tmp_path)
    package_check.record_package(package)
    builds.record(model, "float32", 64, [package], 1.0)
    assert builds.built_length(model, "float32") == 64 and decide(source, machine=this_machine()).engine == "compiled"
    assert capsys.readouterr().err == ""
    with open(library, "r+b") as f:
        f.truncate(4096)
    assert builds.built_length(model, "float32") is None
    plan = decide(source, machine=this_machine())
    assert plan.engine == "eager" and "llamablock compile" in plan.note
    [line] = capsys.readouterr().err.splitlines()  # said once, however often the index is asked
    assert str(library) in line and "is damaged" in line and "llamablock compile --model" in line
    assert library.exists()  # only looked at: `llamablock compile` sets it aside and builds it again
    library.rename(library.with_name(library.name + ".damaged"))  # set aside by an earlier run
    assert builds.built_length(model, "float32") is None
    assert "was set aside as damaged" in capsys.readouterr().err
