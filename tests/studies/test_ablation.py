"""The compare experiment: one change per variant, equal parameter budgets, a table and a plot."""

import json

from llamablock.cli import main
from llamablock.studies.ablation import count_params, run_compare, summarize, variants


def test_each_ablation_changes_one_thing_at_equal_budget():
    v = variants(65, 64)
    base = v["2017"].to_dict()
    expected = {"2017 + RoPE": {"position", "rope_layout"}, "2017 + RMSNorm pre-LN": {"norm", "norm_placement"},
                "2017 + SwiGLU": {"ffn"}, "2017 + GQA": {"n_kv_heads"}, "2017 + GELU": {"ffn"},
                "2017 + MQA": {"n_kv_heads"}}
    for name, fields in expected.items():
        changed = {k for k, x in v[name].to_dict().items() if x != base[k]} - {"d_ff"}
        assert changed == fields, name
    after = v["2024"].to_dict()  # what came next: one change to the 2024 block each
    for name, fields in {"2024 + q/k norm": {"qk_norm"}, "2024 + sandwich norms": {"sandwich_norm"}}.items():
        assert {k for k, x in v[name].to_dict().items() if x != after[k]} - {"d_ff"} == fields, name
    target = count_params(v["2017"])
    for name, cfg in v.items():
        assert abs(count_params(cfg) - target) / target < 0.001, name  # within 0.1%
    # SwiGLU at equal parameters lands at 8/3 d (ffn.py: 3 d d_ff = 2 d 4d), up to its extra biases.
    assert abs(v["2017 + SwiGLU"].d_ff - 8 * 128 / 3) < 2
    assert v["2017 + GQA"].kv_bytes_per_token() * 2 == v["2017"].kv_bytes_per_token()


def test_compare_runs_and_reports(tmp_path, capsys):
    recs = run_compare(steps=2, seeds=(0,), size=dict(d_model=16, n_layers=1, n_heads=2), context=16,
                       batch_size=2, names=["2017", "2024"], log=None)
    assert [r["variant"] for r in recs] == ["2017", "2024"]
    s = summarize(recs)
    assert s[0]["delta_vs_2017"] == 0 and s[1]["kv_bytes_per_token"] == s[0]["kv_bytes_per_token"] // 2
    out = tmp_path / "cmp"
    assert main(["compare", "--steps", "2", "--seeds", "1", "--d-model", "16", "--layers", "1", "--heads", "2",
                 "--context", "16", "--batch-size", "2", "--only", "2017", "--only", "2017 + GQA",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "KV B/tok" in text and "2017 + GQA" in text
    assert len(json.loads((out / "compare.json").read_text())["records"]) == 2
    assert (out / "compare.png").stat().st_size > 1000
    assert main(["compare", "--only", "2017 + MoE", "--steps", "1", "--out", str(out)]) == 2
