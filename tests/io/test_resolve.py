"""Model names: Hugging Face Hub ids resolve through huggingface_hub's cache, offline included,
and a Hub id that is not cached, offline, is one clear error."""

from __future__ import annotations

import pytest
import torch
from hf_reference import tiny_hf_model

import llamablock
from llamablock.io.resolve import resolve_model


def _cache_with(tmp_path, repo_id: str):
    """The layout huggingface_hub's cache uses: models--org--name/{refs/main, snapshots/<commit>/}."""
    root = tmp_path / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    model = tiny_hf_model("llama", n_heads=4, n_kv=2)
    model.save_pretrained(root / "snapshots" / commit)
    return tmp_path / "hub", model


def test_a_cached_hub_id_loads_offline(tmp_path, monkeypatch):
    cache, ref = _cache_with(tmp_path, "someorg/tiny-llama")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("someorg/tiny-llama").name == "0" * 40
    ours = llamablock.load_pretrained("someorg/tiny-llama")
    ids = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        assert (ours(ids) - ref(input_ids=ids).logits).abs().max() <= 1e-4


def test_an_uncached_hub_id_offline_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set and it is not in the Hugging Face cache"):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_other_names_say_what_is_accepted(tmp_path):
    with pytest.raises(FileNotFoundError, match="nor a known model name"):
        resolve_model(str(tmp_path / "nothing-here"))
