"""`llamablock compile` with the context and RoPE-scaling flags: the build is recorded under them
(fast/compiled/builds.py scaled_name), `generate` with the same flags then runs it, and its logits
past the trained context equal the eager engine's (itself equal to transformers' with the same
rope_scaling: tests/faces/test_rope_flags.py) within 1e-4 of the largest logit, the bound the other
compiled parity tests use for float32 (inductor reorders float32 sums). Another scaling is another
build: the same file with other flags runs eagerly."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli
from llamablock.fast.plan import build, decide
from llamablock.io.scaling_flags import add_scaling_arguments, scaled_source
from llamablock.io.source import open_source

FLAGS = ["--ctx-size", "64", "--rope-scaling", "yarn"]  # twice the trained 32


def _generate(capsys, f, *more):
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc def", "--json", "--greedy",
                     "--max-new-tokens", "40", *more]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_a_build_for_the_flags_scaling_serves_them(capsys, tmp_path):
    torch._dynamo.reset()
    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=32))
    eager = _generate(capsys, f, "--engine", "eager", *FLAGS)
    assert cli.main(["compile", "--model", str(f), "--tokens", "64", "--no-autotune", *FLAGS]) == 0
    assert "with the same context flags" in capsys.readouterr().out
    after = _generate(capsys, f, *FLAGS)
    assert after["weights"].endswith("compiled") and after["tokens"] == eager["tokens"]
    other = _generate(capsys, f, "--ctx-size", "64", "--rope-scaling", "linear")
    assert not other["weights"].endswith("compiled")  # another scaling: not this build

    p = argparse.ArgumentParser()
    add_scaling_arguments(p)
    own = open_source(f, tokenizer=False)
    source = scaled_source(own, p.parse_args(FLAGS))
    compiled = build(source, decide(source, "auto", "auto", rescaled=True)).engine
    reference = build(source, decide(source, "auto", "eager", rescaled=True)).engine
    ids = torch.randint(0, source.cfg.vocab_size, (1, 60), generator=torch.Generator().manual_seed(0))
    got, want = [], []
    with torch.no_grad():
        for engine, out in ((compiled, got), (reference, want)):
            engine.prepare(64)
            out.append(engine.prefill(ids[:, :8]))
            out += [engine.step(ids[:, p: p + 1], p) for p in range(8, 60)]  # positions 8..59, past 32
    got, want = torch.cat(got), torch.cat(want)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
