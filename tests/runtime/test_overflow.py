"""Generation past the context (runtime/overflow.py, studies/grouped_cache.py): the cache stays
bounded, and what each step computes is stated independently of the code under test.

shift: after each shift the window is the first `keep` tokens plus a suffix of the sequence,
(context - keep) // 2 tokens shorter than llama.cpp's full cache (plus the new token), and the
logits equal a fresh, cache-free model's on that window (RecomputeEngine: the definition; float32
reordering only, 1e-5 of the largest logit).
"""

from __future__ import annotations

import pytest
import torch
from hf_reference import tiny_hf_model

import llamablock
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate
from llamablock.runtime.overflow import ShiftEngine
from llamablock.studies.grouped_attention import Sinks
from llamablock.studies.grouped_cache import GroupedEngine

CONTEXT = 16


@pytest.fixture()
def model(tmp_path):
    tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=CONTEXT).save_pretrained(tmp_path)
    return llamablock.load_pretrained(tmp_path, torch.float32)


class Recording(ShiftEngine):
    """ShiftEngine noting, at every step, its window and the logits it returned."""

    def step(self, ids, pos):
        logits = super().step(ids, pos)
        self.seen.append((list(self.tokens), logits[0]))
        return logits


@pytest.mark.parametrize("keep", [0, 3])
def test_shift_runs_past_the_context_on_the_kept_window(model, keep):
    eager = EagerEngine(model)
    engine = Recording(eager, CONTEXT, keep)
    engine.seen = []
    prompt = [1, 5, 7, 9, 11, 3]
    g = generate(engine, prompt, 40, eos_ids=())  # 46 tokens through a context of 16
    assert len(g.tokens) == 40 and engine.shifts >= 2
    sequence = prompt + g.tokens
    ref = llamablock.runtime.engine.RecomputeEngine(model)
    for n, (window, logits) in enumerate(engine.seen):
        whole = sequence[: len(prompt) + n + 1]  # the tokens so far, the one this step took included
        assert len(window) <= CONTEXT and window[:keep] == whole[:keep]
        assert window[keep:] == whole[len(whole) - len(window) + keep:]  # the most recent ones, in order
        want = ref.prefill(torch.tensor([window]))[0]
        assert (logits - want).abs().max() <= 1e-5 * want.abs().max()
    lengths = [len(w) for w, _ in engine.seen]
    shifted = [b for a, b in zip(lengths, lengths[1:], strict=False) if b < a]
    assert shifted and set(shifted) == {CONTEXT - (CONTEXT - keep) // 2 + 1}
    assert eager.cache.length <= CONTEXT  # the cache the window lives in never grows past the context


def test_without_a_policy_a_request_past_the_context_is_refused(model):
    with pytest.raises(ValueError, match="exceeds the model's context of 16 tokens"):
        generate(EagerEngine(model), [1, 2, 3], 20, eos_ids=())


def test_sinks_generate_past_the_context_in_a_bounded_cache(model):
    engine = GroupedEngine(model, Sinks(4, CONTEXT - 4))
    g = generate(engine, [1, 5, 7, 9], 60, eos_ids=())
    assert len(g.tokens) == 60 and engine.kept <= CONTEXT


@pytest.mark.parametrize("keep", [-1, CONTEXT - 1])
def test_a_keep_the_context_cannot_hold_is_refused(model, keep):
    with pytest.raises(ValueError, match="--keep must be between 0 and 14"):
        ShiftEngine(EagerEngine(model), CONTEXT, keep)


def test_a_prompt_longer_than_the_context_is_cut_as_a_shift_leaves_it(model):
    """A chat's history can outgrow the context: shift keeps the first `keep` tokens and the most
    recent ones, as many as a shift leaves (context + 1 - (context - keep) // 2)."""
    engine = ShiftEngine(EagerEngine(model), CONTEXT, keep=2)
    prompt = list(range(1, 41))
    engine.prepare(len(prompt))
    logits = engine.prefill(torch.tensor([prompt]))
    assert engine.tokens == prompt[:2] + prompt[-(CONTEXT + 1 - 7 - 2):]
    want = llamablock.runtime.engine.RecomputeEngine(model).prefill(torch.tensor([engine.tokens]))
    assert (logits - want).abs().max() <= 1e-5 * want.abs().max()
