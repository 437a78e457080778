"""A full disk, for real: the writer runs in a subprocess under a file-size limit (RLIMIT_FSIZE,
with SIGXFSZ ignored so that write() fails with EFBIG as on a full disk instead of killing the
process). `train`, its final export and `export` then end with one line, exit status 2, saying no
space is left and naming the file, instead of safetensors' or numpy's traceback; a run whose final
export failed writes it on the next --resume."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap

import pytest
from tiny_run import FLAGS, copy_run, listing

from llamablock import cli

LIMIT = 16 * 1024  # bytes: the JSON files fit, the tiny model's tensors (~40 KB) do not


def _limited():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _run(code: str, limit: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          preexec_fn=_limited if limit else None, timeout=300)


def _cli(argv: list[str]) -> subprocess.CompletedProcess:
    return _run(f"import sys; from llamablock import cli; sys.exit(cli.main({argv!r}))")


def _one_line_full(p: subprocess.CompletedProcess, file) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"no space left on device: {file}" in p.stderr, p.stderr


@pytest.mark.parametrize("fmt, name", [("hf", "out"), ("llamablock", "out"), ("gguf", "out.gguf")])
def test_export_onto_a_full_disk_is_one_line_naming_the_file(made, tmp_path, fmt, name):
    run = copy_run(made, tmp_path / "run")
    out = tmp_path / name
    p = _cli(["export", str(run), str(out), "--format", fmt])
    _one_line_full(p, out / "model.safetensors" if fmt != "gguf" else out)
    assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no staging folder or file left


def test_train_onto_a_full_disk_is_one_line_naming_the_file(tmp_path):
    out = tmp_path / "r"
    p = _cli(["train", *FLAGS, "--steps", "2", "--out", str(out)])
    _one_line_full(p, out / "checkpoints" / "step-000002" / "model.safetensors")
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


def test_a_final_export_that_failed_is_written_by_the_next_resume(tmp_path, capsys):
    """The limit is set only when the final export starts (the checkpoints are written whole)."""
    out = tmp_path / "r"
    p = _run(f"""
        import resource, signal, sys
        import llamablock.training.train as T
        real = T.export_model
        def limited(*a, **k):
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))
            return real(*a, **k)
        T.export_model = limited
        from llamablock import cli
        sys.exit(cli.main({["train", *FLAGS, "--steps", "2", "--out", str(out)]!r}))
    """, limit=False)
    _one_line_full(p, out / "export" / "model.safetensors")
    assert f"llamablock train --resume --out {out}` writes the missing export" in p.stderr
    assert not (out / "export").exists() and (out / "checkpoints" / "latest").read_text() == "step-000002"
    checkpoints = listing(out / "checkpoints")
    assert cli.main(["train", "--resume", "--out", str(out), "--no-progress"]) == 0
    assert "wrote its missing final export" in capsys.readouterr().out
    assert (out / "export" / ".llamablock-export").is_file() and (out / "export" / "model.safetensors").is_file()
    assert listing(out / "checkpoints") == checkpoints
    from llamablock.io.loading import load_model_and_tokenizer

    load_model_and_tokenizer(out / "export")
