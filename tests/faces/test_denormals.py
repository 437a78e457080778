"""The commands that run a model flush denormals to zero while they run, and only then
(llamablock.util.denormals, cli.INFERENCE); the library and the other commands leave the
floating-point state alone."""

from __future__ import annotations

import importlib

import pytest
import torch

from llamablock import cli

TINY = 1e-39  # a float32 denormal: below 2^-126


def _flushed() -> bool:
    return (torch.tensor([TINY]) * 1.0).item() == 0.0


@pytest.mark.parametrize("command, inference", [("generate", True), ("perplexity", True), ("rope", False)])
def test_inference_commands_flush_denormals_while_they_run(monkeypatch, command, inference):
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")
    module = importlib.import_module(cli.COMMANDS[command][0])
    seen = []
    monkeypatch.setattr(module, "run", lambda args: seen.append(_flushed()) or 0)
    assert not _flushed()
    assert cli.main([command, *ARGS[command]]) == 0
    assert seen == [inference]
    assert not _flushed()  # off again after the command


ARGS = {"generate": ["--prompt", "x"], "perplexity": ["text.txt"], "rope": ["layout"]}
