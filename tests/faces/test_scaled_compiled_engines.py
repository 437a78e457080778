"""Every --rope-scaling of tests/faces/test_rope_flags.py on the compiled engines, past the trained context.

The reference is transformers with the same `rope_scaling` (test_rope_flags.CASES and its tiny llama
trained to 16 positions; static "ntk" is the default RoPE at the closed-form base): the logits of
positions past the trained context (in the batch, a row's earlier ones too) within 1e-4 of the largest
logit, the bound the other compiled parity tests use for float32, since inductor and the fused q/k/v
matmuls sum in other orders.

- generate's compiled engine: the plan for the scaled model (`decide(..., "compiled", rescaled=True)`),
  built without autotuning; every method's cache (64 or 48 slots) is too short for the compiled
  prefill's lengths, so the static layout prefills and the AOTInductor step runs every later position;
  one more build, YaRN at 128 slots, runs the compiled prefill past the trained context too;
- serve's batch engine (fast/compiled/batch_compiled.py): three requests at different positions, one
  arriving while two decode, each row checked against transformers on its own tokens. Every method on
  the static layout's step for three rows run eagerly (the program's own graph, as
  tests/fast/compiled/test_batch_compiled.py does), and one, YaRN with its attention factor, compiled;
- dynamic NTK, both semantics: the static step has one set of frequencies and cannot follow the length,
  so the plan refuses `--engine compiled` in one line and `auto` runs eagerly (where test_rope_flags
  shows it equals transformers), whether the flags set it or the model's own config does.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from batch_driver import batched
from test_rope_flags import CASES, N, _hf, flags

from llamablock import cli
from llamablock.fast import plan as plans
from llamablock.fast.compiled.batch_compiled import CompiledBatchEngine
from llamablock.fast.compiled.static_engine import StaticEngine
from llamablock.fast.plan import build, decide
from llamablock.io.scaling_flags import scaled_source
from llamablock.io.source import open_source

RTOL = 1e-4  # of the largest logit
COMPILED_BATCH = "yarn, scale and attention factor"  # cos/sin scaled by the attention factor, a 48-slot cache
# (prompt length, new tokens, arrival step): rows at positions 17..36, 4..33 and 25..36, the third joining later
REQUESTS = [(18, 20, 0), (5, 30, 0), (26, 12, 3)]


def _scaled(tmp_path, argv: list[str]):
    """The unscaled checkpoint as a command opens it, with the flags' context and scaling applied."""
    _hf({"rope_type": "default"}).save_pretrained(tmp_path)
    return scaled_source(open_source(tmp_path, tokenizer=False), flags(argv))


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool((got - want).abs().max() <= RTOL * want.abs().max())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_generates_compiled_engine_equals_transformers_past_the_trained_context(tmp_path, name):
    argv, scaling, theta = CASES[name]
    source = _scaled(tmp_path, argv)
    plan = decide(source, "auto", "compiled", rescaled=True)
    assert plan.engine == "compiled" and plan.scaled
    engine = build(source, replace(plan, autotune=False)).engine  # inductor's default kernels: faster to build
    ids = torch.randint(0, 97, (1, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        engine.prepare(N)
        got = [engine.prefill(ids[:, :20])] + [engine.step(ids[:, p:p + 1], p) for p in range(20, N)]
        want = _hf(scaling, theta)(input_ids=ids, use_cache=False).logits[0, 19:]
    assert engine.running["step"] != "eager"  # the AOTInductor program ran, not its eager fallback
    assert _close(torch.cat(got), want)


@pytest.mark.slow
def test_generates_compiled_prefill_equals_transformers_past_the_trained_context(tmp_path):
    """A 128-slot cache holds the compiled prefill's lengths (32..127): prompts of 40, 77 and 100 tokens
    (the last position of each past 16), then the step to 127, YaRN at 8x with an attention factor."""
    argv = ["--ctx-size", "128", "--rope-scaling", "yarn", "--yarn-attn-factor", "1.5"]
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16,
               "attention_factor": 1.5 * (0.1 * math.log(8.0) + 1)}  # as CASES' "yarn, scale and attention factor"
    source = _scaled(tmp_path, argv)
    engine = build(source, replace(decide(source, "auto", "compiled", rescaled=True), autotune=False)).engine
    ids = torch.randint(0, 97, (1, 128), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        engine.prepare(128)
        got = torch.cat([engine.prefill(ids[:, :t]) for t in (40, 77, 100)] +
                        [engine.step(ids[:, p:p + 1], p) for p in range(100, 127)])
        want = _hf(scaling)(input_ids=ids, use_cache=False).logits[0, [39, 76, *range(99, 127)]]
    assert set(engine.running) == {"step", "prefill"} and "eager" not in engine.running.values()  # both compiled
    assert _close(got, want)


@pytest.mark.parametrize("name, compiled", [
    *(pytest.param(name, False, id=f"{name}, eager step") for name in sorted(CASES)),
    pytest.param(COMPILED_BATCH, True, marks=pytest.mark.slow, id="compiled"),
])
def test_serves_batch_rows_equal_transformers_past_the_trained_context(tmp_path, name, compiled):
    argv, scaling, theta = CASES[name]
    source = _scaled(tmp_path, argv)
    plan = decide(source, "auto", "compiled", batch=3, rescaled=True)
    built = build(source, replace(plan, autotune=False))
    steps = built.engine if compiled else StaticEngine(built.model, plan.fmt, batch=3)
    steps.prepare(source.cfg.max_seq_len)
    engine = CompiledBatchEngine(plans.eager_beside(built, plan), steps, chunk=16)
    in_use, step = [], engine.step
    engine.step = lambda t: (in_use.append((sum(r is not None for r in engine.slots), len(engine.eager.rows))),
                             step(t))[1]
    prompts = [torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(i)).tolist()
               for i, (n, _, _) in enumerate(REQUESTS)]
    got = batched(engine, prompts, REQUESTS)
    assert max(c for c, _ in in_use) == 3 and all(e == 0 for _, e in in_use)  # every row on the compiled rows
    if compiled:
        assert "eager" not in steps.running.values()  # the steps for 3 rows and for 1 compiled
    ref = _hf(scaling, theta)
    for i, prompt in enumerate(prompts):
        tokens, logits = got[i]  # logits j: position len(prompt) - 1 + j, after tokens[:j]
        with torch.no_grad():
            want = ref(input_ids=torch.tensor([prompt + tokens[:-1]]), use_cache=False).logits[0, len(prompt) - 1:]
        assert _close(torch.stack(logits), want), f"request {i}"


@pytest.mark.parametrize("method", ["dynamic", "dynamic-consistent"])
def test_a_length_dependent_scaling_is_refused_by_the_compiled_plan_and_runs_eagerly(tmp_path, capsys, method):
    source = _scaled(tmp_path, ["--ctx-size", "64", "--rope-scaling", method])
    capsys.readouterr()
    with pytest.raises(ValueError, match=f"^--rope-scaling {method} changes RoPE's frequencies with the length, "
                                         r"which a compiled step cannot: run it with --engine eager \(`llamablock compile` "
                                         "has nothing to build for it\)$"):
        decide(source, "auto", "compiled", rescaled=True)
    plan = decide(source, "auto", "auto", batch=3, rescaled=True)
    assert plan.engine == "eager" and "cannot follow a length-dependent RoPE scaling" in plan.note
    assert plan.serving == "batch"  # serve's eager batch engine, one row at a time (test_rope_flags)
    assert cli.main(["compile", "--model", str(tmp_path), "--tokens", "64", "--ctx-size", "64", "--rope-scaling",
                     method]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has nothing to build for it" in err, err


def test_a_models_own_dynamic_scaling_is_refused_before_a_weight_is_read(tmp_path, capsys, monkeypatch):
    """A checkpoint whose config says dynamic: no flag rescales it, and the plan still never compiles it
    (it used to plan the compiled engine and fail in the static layout, after loading the weights)."""
    _hf({"rope_type": "dynamic", "factor": 2.0}).save_pretrained(tmp_path)
    source, _ = open_source(tmp_path, tokenizer=False), capsys.readouterr()
    assert decide(source, "auto", "auto").note.endswith("cannot follow a length-dependent RoPE scaling")
    monkeypatch.setattr(plans, "load_model", lambda *a, **k: pytest.fail("the weights were read"))
    assert cli.main(["compile", "--model", str(tmp_path), "--tokens", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the model's own RoPE scaling dynamic changes RoPE's frequencies" in err, err
