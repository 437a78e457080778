"""15.5.decode-share (lab/exp_decode_share.py): the cache's share of a decode step, judged on synthetic
rounds (each criterion taken away reads differs) and against an attention that skips the cache."""

from test_lab import _broken

from llamablock.attention import Attention
from llamablock.lab import exp_decode_share as x
from llamablock.lab.record import REPRODUCED


def _measured(mha=0.23, gqa=0.14, long=0.5, rounds=8):
    wobble = [0.002 * ((i % 3) - 1) for i in range(rounds)]
    shares = {(32, 8192): [mha + w for w in wobble], (8, 8192): [gqa + w for w in wobble],
              (32, 32768): [long + w for w in wobble], (8, 32768): [gqa + w for w in wobble]}
    names = [f"cache-{kv}-{n}" for kv, n in shares] + ["weights-32", "weights-8"]
    return {"tokens": (8192, 32768), "shares": shares, "nbytes": {n: 1 for n in names}, "ms": {n: 1.0 for n in names}}


def test_decode_share_reproduces_where_the_cache_takes_much_and_grows():
    assert x.judge(_measured()).verdict == REPRODUCED


def test_decode_share_fails_when_the_cache_takes_little():
    _broken(x.judge(_measured(mha=0.05, gqa=0.02, long=0.08)))


def test_decode_share_fails_when_the_share_does_not_grow_with_kv_heads_or_tokens():
    _broken(x.judge(_measured(gqa=0.23)))
    _broken(x.judge(_measured(long=0.23)))


def test_decode_share_fails_with_an_attention_that_skips_the_cache(monkeypatch):
    real = Attention.attend

    def first_key_only(self, q, k, v, inputs, keys=None):  # reads one cached token, not the whole cache
        return real(self, q, k[:, :, :1], v[:, :, :1], inputs)

    monkeypatch.setattr(Attention, "attend", first_key_only)
    _broken(x.judge(x.measure(True)))
