"""The command line as a whole: --version, a --help that does not import torch, --threads on every
command that computes (and the default), output piped into a reader that stops early, `models`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from llamablock import cli
from llamablock.util.threads import physical_cores

# The least each command needs to parse; `run` is replaced, so nothing is computed.
REQUIRED = {"trace": ["--text", "ROMEO:"], "perplexity": ["somefile.txt"]}


def test_version_and_help_answer_without_importing_torch():
    code = ("import sys, contextlib, io\nimport llamablock.cli as c\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try: c.main(['--version'])\n"
            "    except SystemExit: pass\n"
            "    try: c.main(['--help'])\n"
            "    except SystemExit: pass\n"
            "print(repr(out.getvalue()), 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    printed, torch_loaded = r.stdout.rsplit(" ", 1)
    assert "llamablock 0." in printed and "generate" in printed and "models" in printed
    assert torch_loaded.strip() == "False"


def test_the_command_s_own_process_freezes_its_imports_and_a_caller_s_is_left_alone():
    """main() as the process's command (no argv) imports with the collector off, then freezes what the
    imports made and turns it back on; main(argv), a program's or a test's call, changes neither."""
    code = ("import gc, sys\nimport llamablock.cli as c\n"
            "from llamablock.commands import models\nmodels.run = lambda args: 0\n"
            "print(c.main(['models']), gc.get_freeze_count(), gc.isenabled())\n"
            "sys.argv = ['llamablock', 'models']\n"
            "print(c.main(), gc.get_freeze_count() > 1000, gc.isenabled())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.split("\n")[:2] == ["0 0 True", "0 True True"], r.stdout


@pytest.mark.parametrize("command", cli.COMPUTES)
def test_threads_reach_torch_in_every_computing_command(command, monkeypatch):
    module = __import__(cli.COMMANDS[command][0], fromlist=["run"])
    seen = []
    monkeypatch.setattr(module, "run", lambda args: seen.append(torch.get_num_threads()) or 0)
    before = torch.get_num_threads()
    assert cli.main([command, *REQUIRED.get(command, []), "--threads", "3"]) == 0
    assert seen == [3] and torch.get_num_threads() == before  # set for the command, restored after
    assert cli.main([command, *REQUIRED.get(command, [])]) == 0
    assert seen[1] == cli.default_threads() == physical_cores()  # SMT siblings once (tests/util/test_threads.py)


def test_bad_threads_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--threads", "0"])
    assert e.value.code == 2 and "--threads: must be at least 1" in capsys.readouterr().err


def test_commands_that_do_not_compute_take_no_threads():
    for command in set(cli.COMMANDS) - set(cli.COMPUTES):
        with pytest.raises(SystemExit):
            cli.build_parser([command]).parse_args([command, "--threads", "1"])


def test_output_piped_into_head_ends_quietly():
    """`llamablock rope --json` prints far more than a pipe holds; head reads one line and stops."""
    r = subprocess.run(f"{sys.executable} -m llamablock.cli rope --json | head -n 1", shell=True,
                       capture_output=True, text=True, executable="/bin/bash")
    assert r.stdout == "{\n" and r.stderr == ""


def test_models_lists_the_embedded_model_and_the_presets(capsys):
    assert cli.main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed["embedded"] if m["default"]] == ["smollm2-135m-instruct"]
    assert {"llama-3-8b", "gpt-2017-small", "llama-2024-small"} <= {p["name"] for p in listed["presets"]}
