"""kill -9 while an export replaces an earlier one: the old export or the new one is
whole every time, never a mix and never neither, and a later export leaves no temporary behind.

A subprocess exports two different models (A, B) over the same folder in a loop; the test kills it
with SIGKILL at random moments and then checks the folder: exactly the export's files, and weights
equal to A's or to B's. The kill moments are drawn from a seeded generator so a failure repeats.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import copy_run, make_run

from llamablock.io.export import export_run

FILES = {".llamablock-export", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"}
KILLS = 5

LOOP = """
    import sys
    from llamablock.io.export import export_model
    from llamablock.io.llamablock_dir import load_checkpoint
    a, _, state = load_checkpoint(sys.argv[1])
    b, _, _ = load_checkpoint(sys.argv[2])
    print("ready", flush=True)
    while True:
        for m in (a, b):
            export_model(m, state["tokenizer"], sys.argv[3], "hf")
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("made") / "run")


def _whole(out, versions) -> str:
    """Which version (index) the folder `out` holds whole; fails the test otherwise."""
    assert {p.name for p in out.iterdir()} == FILES, sorted(p.name for p in out.iterdir())
    json.loads((out / "config.json").read_text())
    json.loads((out / "tokenizer.json").read_text())
    got = load_file(str(out / "model.safetensors"))
    hits = [i for i, v in enumerate(versions) if got.keys() == v.keys() and all(torch.equal(got[k], v[k]) for k in v)]
    assert hits, "the weights are neither the old export's nor the new one's"
    return hits[0]


@pytest.mark.slow
def test_a_killed_export_leaves_the_old_or_the_new_one_whole(made, tmp_path):
    run = copy_run(made, tmp_path / "run")
    a, b = sorted((run / "checkpoints").glob("step-*"))  # two checkpoints: two different models
    home = tmp_path / "exports"
    home.mkdir()
    out = home / "out"
    versions = []
    for ck in (a, b):
        export_run(ck, out, "hf")
        versions.append(load_file(str(out / "model.safetensors")))
    rng = random.Random(27)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    seen = []
    for _ in range(KILLS):
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LOOP), str(a), str(b), str(out)],
                                 stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        seen.append(_whole(out, versions))
    export_run(b, out, "hf")  # a later export: whole, and the killed writers' temporaries are gone
    assert _whole(out, versions) == 1
    assert os.listdir(home) == ["out"]
