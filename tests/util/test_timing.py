"""util/timing.py: interleaved rounds, alternating order (a fixed order biased ratios by position)."""

from __future__ import annotations

from llamablock.util.timing import interleaved


def test_interleaved_alternates_the_order_round_by_round():
    calls: list[str] = []
    samples = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=4, warmup=1)
    assert calls[:2] == ["a", "b"]  # the warm-up, in order
    assert calls[2:] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert {name: len(s) for name, s in samples.items()} == {"a": 4, "b": 4}
