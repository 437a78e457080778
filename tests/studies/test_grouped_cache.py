"""Sinks and Self-Extend with a KV cache (studies/grouped_cache.py) against the cache-free reference,
studies/grouped_attention.py's full forward over the same tokens (itself tested against plain
attention and its definitions in tests/studies). The cached engine must give the reference's
logits at every position, past the trained context, within float32 reordering (1e-5 of the
largest logit: the cache splits the same sums into other blocks), and the sinks' cache must never
hold more than S + W keys."""

from __future__ import annotations

import pytest
import torch
from hf_reference import tiny_hf_model

import llamablock
from llamablock.studies.grouped_attention import SelfExtend, Sinks, with_grouped_attention
from llamablock.studies.grouped_cache import GroupedEngine


def _model(tmp_path):
    tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=32).save_pretrained(tmp_path)
    return llamablock.load_pretrained(tmp_path, torch.float32)


@pytest.mark.parametrize("scheme", [Sinks(sinks=4, window=12), SelfExtend(group=4, window=8)])
@pytest.mark.parametrize("prompt", [5, 20])
def test_cached_steps_give_the_reference_logits(tmp_path, scheme, prompt):
    model = _model(tmp_path)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 70), generator=torch.Generator().manual_seed(1))  # 2x past 32
    with torch.no_grad():
        want = with_grouped_attention(model, scheme)(ids)[0]  # (70, V)
        engine = GroupedEngine(model, scheme)
        got = [engine.prefill(ids[:, :prompt])[0]]
        kept = [engine.kept]
        for pos in range(prompt, ids.shape[1]):
            got.append(engine.step(ids[:, pos: pos + 1], pos)[0])
            kept.append(engine.kept)
    got = torch.stack(got)  # logits after tokens prompt-1 .. 69
    assert (got - want[prompt - 1:]).abs().max() <= 1e-5 * want.abs().max()
    if isinstance(scheme, Sinks):  # bounded: the sinks and the window less the next query's own slot
        assert max(kept) == scheme.sinks + scheme.window - 1 and kept[-1] == max(kept)
    else:
        assert kept[-1] == ids.shape[1]


def test_the_model_itself_is_left_as_it_was(tmp_path):
    model = _model(tmp_path)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 10))
    with torch.no_grad():
        before = model(ids)
        GroupedEngine(model, Sinks(4, 8)).prefill(ids)
        assert torch.equal(model(ids), before) and type(model.layers[0].attn).__name__ == "Attention"
