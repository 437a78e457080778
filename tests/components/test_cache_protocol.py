"""Every KV cache the attention can be handed satisfies llamablock.kv_cache.Cache.

The attention (llamablock.attention) and the Decoder (llamablock.model) use a cache through the
protocol's members only (length, update, bucketed, key_slots, advance); each cache class of the
package either satisfies it, member by member with compatible signatures (tests/conformance.py),
or is named below with the reason attention never sees it. A new cache class, found by reading
the package's source, fails the inventory until it is placed in one list or the other; a member
removed from a cache fails the conformance (checked below by removing each in turn).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conformance import members, mismatches

from llamablock.config import ModelConfig
from llamablock.kv_cache import Cache, KVCache
from llamablock.runtime.batch import BatchKVCache

PKG = Path(__file__).resolve().parents[2] / "src" / "llamablock"
CFG = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)

# Cache classes the attention is handed, each with the instances that show its variants.
CACHES = {
    "llamablock.kv_cache.KVCache": lambda: [
        KVCache(ModelConfig(**CFG), 2, 16),  # every layer full
        KVCache(ModelConfig(**CFG, sliding_window=4, layer_types=["sliding", "full"]), 2, 16),  # a ring layer
    ],
    "llamablock.runtime.batch.BatchKVCache": lambda: [
        BatchKVCache(ModelConfig(**CFG), 3, 16, torch.float32, "cpu", rows=2),
    ],
}
# Classes named like caches that attention never sees, and why.
NOT_ATTENTION_CACHES = {
    "llamablock.kv_cache.Cache": "the protocol itself",
    "llamablock.kv_cache.StaticKVCache": "the static layout's own layers write it (fast/compiled/static_decode.py)",
    "llamablock.studies.loss_cache.LossCache": "token losses kept on disk, no keys or values",
    "llamablock.commands.cache.Cache": "a row of `llamablock cache`'s table",
}


def cache_classes() -> set[str]:
    """Every class of the package named "...Cache", or whose base is such a class, read from the source."""
    found = set()
    for path in PKG.rglob("*.py"):
        module = ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                if node.name.endswith("Cache") or any(b.endswith("Cache") for b in bases):
                    found.add(f"{module}.{node.name}")
    return found


def test_every_cache_class_is_checked_or_named_with_a_reason():
    assert cache_classes() == set(CACHES) | set(NOT_ATTENTION_CACHES)


def test_the_protocol_is_what_attention_and_the_decoder_use():
    """Every attribute the attention and the Decoder read on their `cache` argument is a member."""
    used = set()
    for name in ("attention.py", "model.py"):
        for node in ast.walk(ast.parse((PKG / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cache":
                used.add(node.attr)
    assert used and used <= set(members(Cache)), used - set(members(Cache))


@pytest.mark.parametrize("name", sorted(CACHES))
def test_each_cache_satisfies_the_protocol(name):
    for cache in CACHES[name]():
        assert mismatches(cache, Cache) == [] and isinstance(cache, Cache)


@pytest.mark.parametrize("name", sorted(CACHES))
@pytest.mark.parametrize("member", sorted(members(Cache)))
def test_a_cache_without_a_member_fails_the_check(monkeypatch, name, member):
    """Each member removed in turn (from the class, or from the instance for an attribute set in
    __init__) is reported; so is a method that stops taking the protocol's arguments."""
    cache = CACHES[name]()[0]
    cls = type(cache)
    if member in vars(cache):
        delattr(cache, member)
    else:
        monkeypatch.delattr(cls, member)
    assert any(line.startswith(f"{member}:") for line in mismatches(cache, Cache))


@pytest.mark.parametrize("name", sorted(CACHES))
def test_a_method_with_another_signature_fails_the_check(monkeypatch, name):
    cache = CACHES[name]()[0]
    monkeypatch.setattr(type(cache), "update", lambda self, layer, kv: None)
    monkeypatch.setattr(type(cache), "advance", lambda self, t, again: None)
    assert [line.split(":")[0] for line in mismatches(cache, Cache)] == ["update", "advance"]
