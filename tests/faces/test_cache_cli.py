"""`llamablock cache`: sizes of what llamablock keeps on disk, and --clear deleting only its own."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile

import pytest

from llamablock.cli import main
from llamablock.commands import cache


def _fill(path, nbytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * nbytes)


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # never the machine's temporary folder
    root = tmp_path / "llamablock"
    _fill(root / "inductor" / "llamablock-aoti" / "0123" / "lib.so", 3000)
    _fill(root / "inductor" / "fxgraph" / "entry", 2000)
    _fill(root / "trace-v1" / "llama-2024" / "model.safetensors", 1000)
    return root


def test_cache_reports_each_part_and_clears_the_compile_caches(home, capsys):
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "compiled programs" in out and "2.93 KiB" in out  # 3000 bytes of packages
    assert "inductor's caches" in out and "1.95 KiB" in out  # 2000 bytes, the packages not counted twice
    assert "trained tracer models" in out and "1000 B" in out
    assert main(["cache", "--clear"]) == 0
    assert "4.88 KiB" in capsys.readouterr().out  # both compile caches, 5000 bytes
    assert not (home / "inductor").exists() and (home / "trace-v1" / "llama-2024").is_dir()
    assert main(["cache", "--clear", "models"]) == 0
    assert not (home / "trace-v1").exists()
    assert main(["cache", "--clear", "all"]) == 0
    assert capsys.readouterr().out.strip().endswith("nothing to delete")


def test_a_users_inductor_directory_keeps_everything_but_llamablocks_packages(home, monkeypatch, tmp_path, capsys):
    mine = tmp_path / "mine"
    _fill(mine / "llamablock-aoti" / "0123" / "lib.so", 10)
    _fill(mine / "fxgraph" / "someone-elses", 10)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    assert main(["cache"]) == 0
    assert "yours: --clear keeps it" in capsys.readouterr().out
    assert main(["cache", "--clear", "all"]) == 0
    assert not (mine / "llamablock-aoti").exists() and (mine / "fxgraph" / "someone-elses").is_file()
    assert (home / "inductor" / "fxgraph" / "entry").is_file()  # not the directory in use: not touched


def test_clear_names_its_choices(home, capsys):
    with pytest.raises(SystemExit) as e:
        main(["cache", "--clear", "everything"])
    assert e.value.code == 2 and "choose from 'compiled', 'losses', 'models', 'bench', 'all'" in capsys.readouterr().err


def test_cache_lists_and_clears_the_kernel_libraries_and_killed_compiles(home, capsys):
    """The block kernel's libraries (and the damaged ones set aside) are listed and cleared with the
    compile caches; a staging folder whose compile was killed is counted as unfinished, one whose
    process still runs is not."""
    _fill(home / "kernels" / "ggml_dot-f1-key.so", 600)
    _fill(home / "kernels" / "ggml_dot-f1-old.so.damaged", 400)
    packages = home / "inductor" / "llamablock-aoti"
    killed, running = packages / f".{'a' * 32}.99999999", packages / f".{'b' * 32}.{os.getpid()}"
    _fill(killed / "partial", 0)  # no such process
    _fill(running / "partial", 0)  # running: this one
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("kernel libraries"))
    assert "1000 B" in line and str(home / "kernels") in line and "1 damaged, set aside" in line
    assert "1 unfinished (killed compiles' staging folders)" in out
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert str(home / "kernels") in out and "kept 1 staging folder of compiles still running" in out
    assert not (home / "kernels").exists() and not killed.exists() and not (home / "inductor" / "fxgraph").exists()
    assert sorted((home / "inductor").rglob("*")) == [packages, running, running / "partial"]


def test_clearing_a_read_only_cache_is_one_line_naming_the_folder(home, monkeypatch, capsys):
    def refuse(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), ".ggml_dot-f1-key.so.lock")  # as rmtree names it

    _fill(home / "kernels" / "ggml_dot-f1-key.so", 600)
    monkeypatch.setattr(cache.shutil, "rmtree", refuse)
    assert main(["cache", "--clear"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Read-only file system: " in err and str(home / "inductor") in err, err


def test_cache_lists_and_clears_every_kind_llamablock_writes(home, tmp_path, capsys):
    """The builds index, rope eval's losses and the temporary folders of processes that are gone are
    listed and cleared too; those of running processes and inductor's shared headers are kept."""
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    tmp = tmp_path / "tmp"
    _fill(home / "inductor" / "llamablock-aoti" / "builds.json", 100)
    _fill(home / "kernels" / "ggml_dot-f1-key.so", 600)
    _fill(home / "rope-eval" / "key.losses", 700)
    _fill(home / "bench" / "llama-Q4_0.gguf", 300)
    killed, running = tmp / f"llamablock-inductor-{dead}-abcd1234", tmp / f"llamablock-kernels-{os.getpid()}-efgh5678"
    _fill(killed / "fxgraph" / "entry", 800)
    _fill(running / "ggml_dot.so", 50)
    headers = cache.headers_dir()
    _fill(headers / "c0.h.gch", 900)
    _fill(tmp / "someone-elses" / "file", 10)
    assert main(["cache"]) == 0
    lines = {ln.split("  ")[0].strip(): ln for ln in capsys.readouterr().out.splitlines()}
    for what, size in [("compiled programs", "2.93 KiB"), ("builds index", "100 B"), ("inductor's caches", "1.95 KiB"),
                       ("kernel libraries", "600 B"), ("rope eval's losses", "700 B"),
                       ("trained tracer models", "1000 B"), ("benchmark files", "300 B"), ("temporary folders", "850 B"),
                       ("inductor's headers", "900 B")]:
        assert size in lines[what], (what, lines)
    assert "1 in use by running processes" in lines["temporary folders"]
    assert "--clear keeps them" in lines["inductor's headers"]
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert str(killed) in out and str(home / "kernels") in out and str(home / "inductor") in out
    assert not (home / "inductor").exists() and not (home / "kernels").exists() and not killed.exists()
    assert (home / "rope-eval" / "key.losses").is_file() and running.is_dir() and (headers / "c0.h.gch").is_file()
    assert main(["cache", "--clear", "losses"]) == 0
    assert not (home / "rope-eval").exists() and (home / "trace-v1").is_dir() and (home / "bench").is_dir()
    assert main(["cache", "--clear", "bench"]) == 0
    assert not (home / "bench").exists() and (home / "trace-v1").is_dir()
    assert main(["cache", "--clear", "all"]) == 0
    assert not (home / "trace-v1").exists()
    assert running.is_dir() and (headers / "c0.h.gch").is_file() and (tmp / "someone-elses" / "file").is_file()
