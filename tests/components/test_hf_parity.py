"""Whole-model parity with transformers (the reference), float32 on CPU.

Tolerance: max |logit difference| <= 1e-4, the issue's bound; observed differences are ~1e-6.
Each tiny model is saved with transformers' save_pretrained and loaded with ours.
"""

import pytest
import torch
from hf_reference import max_logit_gap_at_offsets, tiny_hf_model

import llamablock

CASES = [
    ("llama", dict(n_heads=4, n_kv=4)),  # MHA
    ("llama", dict(n_heads=4, n_kv=2)),  # GQA
    ("llama", dict(n_heads=4, n_kv=1, tied=True)),  # MQA, tied
    ("llama", dict(n_heads=4, n_kv=2, attention_bias=True, mlp_bias=True)),
    ("mistral", dict(n_heads=4, n_kv=2)),
    ("mistral", dict(n_heads=4, n_kv=1, tied=True)),
    ("qwen2", dict(n_heads=4, n_kv=2, tied=True)),
    ("qwen2", dict(n_heads=4, n_kv=4)),
    ("gemma", dict(n_heads=4, n_kv=1)),
    ("gemma", dict(n_heads=4, n_kv=2)),
]
IDS = [f"{f}-{'-'.join(f'{k}{v}' for k, v in kw.items())}" for f, kw in CASES]


def _load_pair(tmp_path, family, kw):
    hf = tiny_hf_model(family, **kw)
    hf.save_pretrained(tmp_path)
    return hf, llamablock.load_pretrained(tmp_path)


@pytest.mark.parametrize("family,kw", CASES, ids=IDS)
def test_logits_match_transformers(tmp_path, family, kw):
    hf, ours = _load_pair(tmp_path, family, kw)
    assert max_logit_gap_at_offsets(hf, ours) <= 1e-4  # 24 tokens: longer than mistral's window of 8


@pytest.mark.parametrize("family,kw", CASES, ids=IDS)
def test_cached_decode_equals_full_forward(tmp_path, family, kw):
    _, ours = _load_pair(tmp_path, family, kw)
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = ours(ids)
        cache = llamablock.KVCache(ours.cfg, batch_size=2, max_len=32)
        steps = [ours(ids[:, :5], cache=cache)]  # a prefill of 5, then one token at a time
        steps += [ours(ids[:, i : i + 1], cache=cache) for i in range(5, 20)]
    assert (torch.cat(steps, 1) - full).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["llama", "gemma", "qwen2", "mistral"])
def test_our_save_loads_in_transformers(tmp_path, family):
    import transformers

    hf, ours = _load_pair(tmp_path / "a", family, dict(n_heads=4, n_kv=2))
    llamablock.save_pretrained(ours, tmp_path / "b")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "b", attn_implementation="eager").eval()
    ids = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        assert (back(ids).logits - hf(ids).logits).abs().max().item() == 0.0
