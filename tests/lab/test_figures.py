"""The report's figures draw what their claims measure: rope-invariance.png from the trained 2017
model that 15.1.learned-table-shift judges (a stand-in model whose table ignores position draws a
flat learned line), kv-cache.png's legend in the singular for one KV head."""

import torch

from llamablock.lab import exp_gqa, exp_rope, plots


def _fake_2017(rows):
    from llamablock.model import Decoder
    from llamablock.presets import preset

    cfg = preset("gpt-2017-small", d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, max_seq_len=64)
    torch.manual_seed(0)
    state = Decoder(cfg).state_dict()
    state["positions.table.weight"] = rows(64, 64)
    return lambda quick: (state, cfg)


def _drawn(monkeypatch, draw):
    """The line data and legend labels of the figure `draw` makes."""
    got = {}

    def keep(fig, out, name):
        ax = fig.axes[0]
        got["lines"] = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
        plots.pyplot().close(fig)
        return [name]

    monkeypatch.setattr(plots, "save", keep)
    draw()
    return got["lines"]


def test_rope_invariance_is_drawn_from_the_claims_model(monkeypatch):
    monkeypatch.setattr(exp_rope, "trained_2017", _fake_2017(lambda n, d: torch.randn(1, d).expand(n, d)))
    flat = _drawn(monkeypatch, lambda: exp_rope.plot_scores(None, True))
    learned = next(v for k, v in flat.items() if "learned table" in k)
    assert max(learned) - min(learned) < 1e-4  # a table without position: the score does not move
    monkeypatch.setattr(exp_rope, "trained_2017", _fake_2017(lambda n, d: torch.randn(n, d)))
    moving = _drawn(monkeypatch, lambda: exp_rope.plot_scores(None, True))
    learned = next(v for k, v in moving.items() if "learned table" in k)
    rope = next(v for k, v in moving.items() if "RoPE" in k)
    assert max(learned) - min(learned) > 1e3 * (max(rope) - min(rope) + 1e-9)
    assert len(learned) == 64 - 7  # every row of the model's table the pair can slide over


def test_kv_cache_legend_says_head_for_one(monkeypatch):
    labels = list(_drawn(monkeypatch, lambda: exp_gqa.plot_cache(None)))
    assert "1 KV head (MQA)" in labels and "32 KV heads (MHA)" in labels
