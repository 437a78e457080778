"""rope eval's loss cache (studies/loss_cache.py): an entry of the right length but the wrong content
is ignored with one line and computed again; a cache that cannot be written computes without caching."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import torch

from llamablock.studies import loss_cache
from llamablock.studies.loss_cache import LossCache

IDS = torch.arange(10)[None]
LOSSES = torch.linspace(0.5, 3.0, 9)


def _kept(tmp_path):
    cache = LossCache(tmp_path / "losses")
    key = cache.key("model", IDS, "yarn", {"factor": 2}, 10, "torch.float32")
    cache.put(key, LOSSES, IDS)
    return cache, key


def _body(path):
    """The offset and bytes of an entry's losses (after its one-line header)."""
    data = path.read_bytes()
    start = data.index(b"\n") + 1
    return start, data


def test_an_entry_is_read_back_for_its_tokens(tmp_path, capsys):
    cache, key = _kept(tmp_path)
    assert torch.equal(cache.get(key, 9, IDS), LOSSES) and cache.hits == 1
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("damage", ["nan", "altered", "other tokens", "another entry", "no header", "short"])
def test_an_entry_of_the_wrong_content_is_ignored_in_one_line(tmp_path, capsys, damage):
    """NaN or changed values of the right length (once used silently: a wrong perplexity), an entry
    made for other tokens, another method's entry on the same tokens copied over it, a file of raw
    losses without a header, one cut short."""
    cache, key = _kept(tmp_path)
    path = cache.path(key)
    start, data = _body(path)
    body = bytearray(data[start:])
    if damage == "nan":
        body[:4] = np.float32("nan").tobytes()
        path.write_bytes(data[:start] + bytes(body))
    elif damage == "altered":
        body[:4] = np.float32(0.25).tobytes()
        path.write_bytes(data[:start] + bytes(body))
    elif damage == "other tokens":
        LossCache(tmp_path / "other").put(key, LOSSES, IDS + 1)
        path.write_bytes((tmp_path / "other" / path.name).read_bytes())
    elif damage == "another entry":
        other = cache.key("model", IDS, "ntk", {"factor": 2}, 10, "torch.float32")
        cache.put(other, LOSSES * 2, IDS)
        path.write_bytes(cache.path(other).read_bytes())
    elif damage == "no header":
        path.write_bytes(bytes(body))
    else:
        path.write_bytes(data[:-4])
    assert cache.get(key, 9, IDS) is None and cache.misses == 1 and cache.hits == 0
    [line] = capsys.readouterr().err.splitlines()
    assert str(path) in line and "is damaged" in line and "computing it again" in line
    cache.put(key, LOSSES, IDS)  # computed again, and kept whole
    assert torch.equal(cache.get(key, 9, IDS), LOSSES)


def test_an_unwritable_cache_computes_without_caching_in_one_line(tmp_path, capsys):
    """A cache folder under a file (what no user, root included, can write) and a read-only one:
    nothing kept, no traceback, said once."""
    (tmp_path / "a-file").write_text("")
    cache = LossCache(tmp_path / "a-file" / "losses")
    key = cache.key("model", IDS, "yarn", {}, 10, "torch.float32")
    assert cache.get(key, 9, IDS) is None
    cache.put(key, LOSSES, IDS)
    cache.put(key, LOSSES, IDS)
    [line] = capsys.readouterr().err.splitlines()
    assert str(tmp_path / "a-file" / "losses") in line and "computing without caching" in line


def test_a_read_only_cache_is_still_read(tmp_path, monkeypatch, capsys):
    cache, key = _kept(tmp_path)

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(loss_cache, "atomic_write", refuse)
    assert torch.equal(cache.get(key, 9, IDS), LOSSES)
    other = cache.key("model", IDS, "ntk", {}, 10, "torch.float32")
    cache.put(other, LOSSES, IDS)
    [line] = capsys.readouterr().err.splitlines()
    assert "Read-only file system" in line and "computing without caching" in line
