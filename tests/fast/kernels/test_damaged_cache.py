"""A kernel library in the user's cache that is damaged, another file, or read-only never crashes a
command nor changes its answer: it is found before it is loaded, moved aside and built again, with
one line saying so (fast/kernels/build.py `verified`, `load`).

References: a clean run of `llamablock generate` (the embedded model, greedy) in a fresh cache gives
the tokens every damaged cache must give too; a library freshly built in its own folder gives the
products a rebuilt one must. Commands run as child processes, since a cut-short library kills its
process with SIGBUS. A read-only cache is a real one: a folder without write permission, or, for
root (whom permissions do not stop), a read-only bind mount in a mount namespace of its own; where
neither can be made, a simulation in this process (every write call under the cache fails).
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import torch

from llamablock.fast.kernels import build, ggml_kernel

GENERATE = [sys.executable, "-m", "llamablock", "generate", "--prompt", "abc", "--max-new-tokens", "2", "--json"]


def _run(cache: Path, argv: list[str] = GENERATE, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("LLAMABLOCK_NO_KERNEL", None)
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, env=env, timeout=600)


def _answer(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, f"exit {done.returncode} (a negative one is a signal): {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _library(cache: Path) -> Path:
    (path,) = (cache / "llamablock" / "kernels").glob("ggml_dot-*.so")
    return path


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A cache where a clean run built the kernel, and that run's answer."""
    cache = tmp_path_factory.mktemp("clean")
    answer = _answer(_run(cache))
    assert "blocks" in answer["weights"], answer["weights"]  # the file's own blocks: the kernel ran
    return cache, answer


def _copy(clean, tmp_path) -> Path:
    shutil.copytree(clean[0] / "llamablock" / "kernels", tmp_path / "llamablock" / "kernels")
    return tmp_path


def _same(answer: dict, clean: dict) -> bool:
    """The same tokens, text and weights (the kernel on the file's own blocks) as the clean run."""
    return all(answer[k] == clean[k] for k in ("tokens", "text", "weights"))


def _damaged_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "is damaged" in ln]


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_library_is_built_again_and_the_answer_is_the_same(clean, tmp_path, damage):
    cache = _copy(clean, tmp_path)
    lib = _library(cache)
    whole = lib.read_bytes()
    if damage == "garbage":
        lib.write_bytes(os.urandom(4096))
    else:
        os.truncate(lib, 4096)  # the ELF header intact: loading it maps pages past its end (SIGBUS)
    done = _run(cache)
    assert _same(_answer(done), clean[1])
    (line,) = _damaged_lines(done.stderr)
    assert str(lib) in line and "building it again" in line
    assert lib.read_bytes() == whole and lib.with_name(lib.name + ".damaged").stat().st_size == 4096
    assert not _damaged_lines(_run(cache).stderr)  # healed: the next run says nothing


def _libm() -> Path:
    """The C maths library this process has loaded: another library, without the kernel's symbols."""
    maps = Path("/proc/self/maps")
    found = [ln.split()[-1] for ln in maps.read_text().splitlines() if "/libm" in ln] if maps.exists() else []
    if not found:
        pytest.skip("no libm in /proc/self/maps")
    return Path(found[0])


def _q8(n: int, k: int) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)).numpy()
    return torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0).copy())


def test_another_library_in_the_kernels_place_is_built_again(tmp_path, capsys):
    """libm renamed as the kernel: found by its size against the record; and with a record of its
    own (so it loads), by the missing lb_linear. Each time moved aside, rebuilt, and what it computes
    is a fresh build's. Each case has a folder of its own: the dynamic loader hands a path it has
    loaded before back by name, whatever the file there is now."""
    fresh = ggml_kernel.load(tmp_path / "fresh")
    raw, x = _q8(16, 64), torch.randn(2, 64)
    want = ggml_kernel.matmul("Q8_0", raw, x, lib=fresh)
    capsys.readouterr()
    for record in (False, True):
        folder = tmp_path / f"record {record}"
        shutil.copytree(tmp_path / "fresh", folder)
        (path,) = folder.glob("*.so")
        shutil.copyfile(_libm(), tmp_path / "libm")
        os.replace(tmp_path / "libm", path)
        if record:
            build.record(path)
        lib = ggml_kernel.load(folder)
        (line,) = _damaged_lines(capsys.readouterr().err)
        assert ("lacks the kernel's symbols: undefined symbol: lb_linear" if record else "where its record says") \
            in line, line
        assert torch.equal(ggml_kernel.matmul("Q8_0", raw, x, lib=lib), want)
        assert build.damage(path) is None


OPERATOR = """
import torch
from llamablock.fast.kernels import block_op, ggml_kernel
print(block_op.load(), block_op.why_not())
raw, x = torch.randint(0, 256, (8, 34), dtype=torch.uint8), torch.randn(3, 32)
raw[:, :2] = torch.tensor([0, 60], dtype=torch.uint8)  # each block's float16 scale: 1.0
print(torch.equal(block_op.linear("Q8_0", raw, x), ggml_kernel.matmul("Q8_0", raw, x)))
"""


@pytest.mark.slow
def test_a_library_without_the_operator_in_its_place_is_built_again(clean, tmp_path):
    """The ctypes kernel (the same C symbols, no operator) as the operator's library, with a record
    that matches it: it loads, registers no llamablock::block_linear, and is built again."""
    cache = _copy(clean, tmp_path)
    built = _run(cache, [sys.executable, "-c", OPERATOR])
    assert built.stdout.split() == ["True", "True"], built.stderr
    (path,) = (cache / "llamablock" / "kernels").glob("block_op-*.so")
    shutil.copyfile(_library(cache), tmp_path / "other")
    os.replace(tmp_path / "other", path)
    build.record(path)
    done = _run(cache, [sys.executable, "-c", OPERATOR])
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr
    (line,) = _damaged_lines(done.stderr)
    assert "registers no operator llamablock::block_linear" in line and str(path) in line


def test_a_damaged_library_that_cannot_be_built_again_is_the_fallbacks_reason(tmp_path, monkeypatch, capsys):
    """No working compiler: kernel() is None and why_not says the library was damaged, so the loader
    re-quantizes (its existing fallback) instead of loading it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # built and loaded in one folder, damaged as a copy in the cache: truncating a library this process
    # has mapped would fault on its pages later (a SIGBUS at exit, when its finalizers run)
    ggml_kernel.load(tmp_path / "built")
    kernels = tmp_path / "llamablock" / "kernels"
    kernels.mkdir(parents=True)
    for f in (tmp_path / "built").glob("*.so*"):
        shutil.copyfile(f, kernels / f.name)
    (path,) = kernels.glob("*.so")
    os.truncate(path, 4096)
    monkeypatch.setenv("CC", "false")
    monkeypatch.setattr(ggml_kernel, "_why_not", [])
    ggml_kernel.kernel.cache_clear()
    try:
        assert ggml_kernel.kernel() is None
        assert "was damaged (it is 4096 bytes" in ggml_kernel.why_not(), ggml_kernel.why_not()
    finally:
        ggml_kernel.kernel.cache_clear()
    assert len(_damaged_lines(capsys.readouterr().err)) == 1


def _load(folder: Path) -> None:
    ggml_kernel.load(folder)


def test_processes_building_at_once_build_one_library_with_its_record(tmp_path, monkeypatch, capfd):
    """Four processes asking for the library in an empty folder: one compiles it (a compiler that
    counts its runs), the others wait for it (the lock beside it) and find it whole, with its record."""
    log = tmp_path / "compiles"
    counting = tmp_path / "cc"
    counting.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec {shutil.which("cc")} "$@"\n')
    counting.chmod(0o755)
    monkeypatch.setenv("CC", str(counting))
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_load, [tmp_path / "k"] * 4)
    (path,) = (tmp_path / "k").glob("*.so")
    assert build.damage(path) is None and not list((tmp_path / "k").glob("*.damaged"))
    assert "damaged" not in capfd.readouterr().err
    assert log.read_text().count("run") == 1


# Read-only caches ----------------------------------------------------------------------------------
def _read_only(cache: Path) -> tuple[str, ...] | None:
    """The command prefix under which `cache` is read-only, after chmod for a user; for root, a
    read-only bind mount in a mount namespace of its own; None where neither works here."""
    if os.geteuid() != 0:
        for d in [cache, *cache.rglob("*")]:
            if d.is_dir():
                d.chmod(0o555)
        return ()
    prefix = ("unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(cache))
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode:
        return None
    probe = subprocess.run([*prefix, "touch", str(cache / "probe")], capture_output=True)
    return prefix if probe.returncode else None


def _writable_again(cache: Path) -> None:
    for d in [cache, *cache.rglob("*")]:
        if d.is_dir():
            d.chmod(0o755)


@pytest.mark.parametrize("state", ["valid", "absent", "damaged"])
def test_a_read_only_cache(clean, tmp_path, state):
    """valid: used as it is, nothing written and nothing said; absent or damaged: built in a
    temporary folder for this process, one line saying so, the same answer."""
    cache = _copy(clean, tmp_path)
    lib = _library(cache)
    if state == "absent":
        lib.unlink()
    if state == "damaged":
        os.truncate(lib, 4096)
    before = sorted((p.name, p.stat().st_size) for p in lib.parent.iterdir())
    prefix = _read_only(cache)
    if prefix is None:
        pytest.skip("no read-only folder can be made here (root without mount namespaces); see the simulated test")
    try:
        done = _run(cache, prefix=prefix)
    finally:
        _writable_again(cache)
    answer = _answer(done)
    assert _same(answer, clean[1]), answer
    notes = [ln for ln in done.stderr.splitlines() if ln.startswith("llamablock: ")]
    if state == "valid":
        assert notes == []
    else:
        assert len(notes) == 1 and "cannot be written" in notes[0] and "for this process only" in notes[0], notes
    assert sorted((p.name, p.stat().st_size) for p in lib.parent.iterdir()) == before


def test_a_simulated_read_only_cache_serves_a_valid_library(tmp_path, monkeypatch, capsys):
    """The same, in this process: every call that would write under the cache (open for writing,
    mkdir, utime, rename, unlink, a temporary file) fails with EROFS, as on a read-only mount."""
    ggml_kernel.load(tmp_path / "k")
    root = str(tmp_path / "k")

    def refuse(call, path_arg=0, writes=lambda *a, **k: True):
        def guarded(*args, **kwargs):
            if str(args[path_arg]).startswith(root) and writes(*args, **kwargs):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(args[path_arg]))
            return call(*args, **kwargs)
        return guarded

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC
    monkeypatch.setattr(os, "open", refuse(os.open, writes=lambda p, flags, *a, **k: flags & write_flags
                                           and not (flags == os.O_RDONLY | os.O_CREAT and os.path.exists(p))))
    opened = refuse(io.open, writes=lambda p, mode="r", *a, **k: mode[0] in "wax" or "+" in mode)
    monkeypatch.setattr(builtins, "open", opened)
    monkeypatch.setattr(io, "open", opened)
    for name in ("mkdir", "utime", "replace", "rename", "unlink"):
        monkeypatch.setattr(os, name, refuse(getattr(os, name)))
    capsys.readouterr()
    lib = ggml_kernel.load(tmp_path / "k")
    assert capsys.readouterr().err == ""  # used as it is: nothing written, nothing to say
    raw, x = _q8(8, 32), torch.randn(1, 32)
    assert torch.equal(ggml_kernel.matmul("Q8_0", raw, x, lib=lib), ggml_kernel.matmul("Q8_0", raw, x))
    (path,) = (tmp_path / "k").glob("*.so")
    monkeypatch.setattr(build, "damage", lambda p: "simulated" if p == path else None)
    lib = ggml_kernel.load(tmp_path / "k")  # damaged and not movable: built in a temporary folder
    err = capsys.readouterr().err
    assert "cannot be moved aside" in err and "for this process only" in err and path.exists()
    assert torch.equal(ggml_kernel.matmul("Q8_0", raw, x, lib=lib), ggml_kernel.matmul("Q8_0", raw, x))


@pytest.mark.parametrize("damage", ["directory", "broken link"])
def test_a_directory_or_a_broken_link_in_a_librarys_place_is_replaced(tmp_path, capsys, damage):
    """Not a file at all, and with a damaged library set aside before (which a directory cannot be
    renamed over): said in one line and built again in place, not in a temporary folder for ever."""
    path = tmp_path / "ggml_dot-f1-key.so"
    path.write_bytes(b"built")
    build.record(path)
    path.with_name(path.name + ".damaged").write_bytes(b"an earlier damaged one")
    path.unlink()
    path.mkdir() if damage == "directory" else path.symlink_to(tmp_path / "nowhere.so")
    assert build.verified(path, lambda tmp: tmp.write_bytes(b"built")) == path
    assert path.is_file() and not path.is_symlink() and path.read_bytes() == b"built" and build.damage(path) is None
    [line] = capsys.readouterr().err.splitlines()
    assert str(path) in line and "is damaged" in line and "building it again" in line
