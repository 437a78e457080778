"""The lab: every record complete; deterministic claims asserted against the module's numbers;
measured-noise claims (timings, spreads) asserted only to have been computed."""

import json
import math

import pytest

from llamablock.cli import main
from llamablock.lab import exp_blocks, exp_ffn, exp_gqa, exp_rope
from llamablock.lab.record import NOT_MEASURABLE, REPRODUCED

FIELDS = {"id", "section", "claim", "source_value", "measured", "unit", "tolerance", "verdict", "details"}


def _by_id(claims):
    return {c.id: c for c in claims}


def test_rope_claims():
    got = _by_id(exp_rope.run(quick=True, out=None))
    assert got["15.1.rotation-identity"].verdict == REPRODUCED  # symbolic identity: exact
    # 10000^(126/128), the exact ratio of the first to the last frequency at d = 128
    assert got["15.1.frequency-ratio"].measured == pytest.approx(10000 ** (126 / 128), rel=1e-6)
    assert got["15.1.learned-table-no-entry"].verdict == REPRODUCED
    for noisy in ("15.1.rope-2d-offset", "15.1.rope-head-offset", "15.1.learned-table-shift"):
        assert math.isfinite(got[noisy].measured)


def test_ffn_claims_match_the_module():
    got = _by_id(exp_ffn.run(quick=True, out=None))
    assert [round(v, 2) for v in got["15.4.swish-values"].measured] == [1.76, -0.24]
    assert got["15.4.width-rule"].measured == [10922.67, 11008]
    assert all(c.verdict == REPRODUCED for c in got.values())


def test_gqa_claims_match_the_module():
    got = _by_id([exp_gqa.claim_cache_sizes(), exp_gqa.claim_exercise(), exp_gqa.claim_gqa_is_mha(),
                  exp_gqa.claim_param_counts()])
    assert got["15.5.cache-bytes"].measured == ["4 GiB", "1 GiB", "128 MiB"]
    assert got["15.5.gqa-equals-mha"].measured == 0.0
    assert got["15.5.attention-params"].measured == [16448, 9280]
    assert all(c.verdict == REPRODUCED for c in got.values())


def test_block_and_exercise_claims():
    got = _by_id(exp_blocks.run(quick=True, out=None))
    assert got["ex.rmsnorm-saving"].measured == 4096
    assert got["ex.kv-cache"].measured == 4
    assert got["ex.swiglu-width"].measured == 10922.67
    assert all(c.verdict == REPRODUCED for c in got.values())


@pytest.mark.slow
def test_lab_quick_end_to_end(tmp_path, capsys):
    assert main(["lab", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "15.5.cache-bytes" in table and "verdict" in table
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["claims"] and all(set(c) == FIELDS for c in doc["claims"])
    assert all(c["verdict"] in (REPRODUCED, "differs", NOT_MEASURABLE) for c in doc["claims"])
    assert not [c for c in doc["claims"] if c["id"].endswith("experiment-error")]
    from llamablock.lab.runner import EXPERIMENTS, claim_ids

    # Every claim the lab records is declared (so --only can find it), and every declared one ran.
    assert sorted(c["id"] for c in doc["claims"]) == sorted(i for e in EXPERIMENTS for i in claim_ids(e[0]))
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# The LLaMA Block, measured")
    for plot in (tmp_path).glob("*.png"):
        assert f"]({plot.name})" in report


def test_lab_only_and_bad_only(tmp_path, capsys):
    assert main(["lab", "--only", "15.4.swish", "--out", str(tmp_path), "--no-progress"]) == 0
    ids = [c["id"] for c in json.loads((tmp_path / "results.json").read_text())["claims"]]
    assert ids == ["15.4.swish-values"]
    assert main(["lab", "--only", "17.2"]) == 2
    assert "matches no experiment" in capsys.readouterr().err


def test_kv_cache_command(capsys):
    assert main(["kv-cache", "--config", "llama-3-8b", "--tokens", "8192", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    totals = {r["kv_heads"]: r["total_bytes"] for r in doc["layouts"]}
    assert totals == {32: 4 * 2**30, 8: 2**30, 1: 128 * 2**20}  # module 15.5
    # Mistral's sliding window keeps 4096 tokens per layer whatever the context.
    assert main(["kv-cache", "--config", "mistral-7b", "--tokens", "32768", "--json"]) == 0
    mistral = json.loads(capsys.readouterr().out)["layouts"]
    assert {r["tokens_kept"] for r in mistral} == {4096}
    assert main(["kv-cache", "--config", "llama-3-8b", "--tokens", "0"]) == 2
    assert "tokens and batch must be positive" in capsys.readouterr().err


def test_scaling_claims_closed_forms():
    from llamablock.lab import exp_scaling

    got = _by_id(exp_scaling.run(quick=True, out=None))
    assert got["15.2.interpolation-crowds"].measured == pytest.approx(8.0, rel=1e-6)  # 32768 / 4096
    assert got["15.2.ntk-exponent"].measured == pytest.approx([8.0, 1.0], rel=1e-5)
    assert got["15.2.raise-base"].measured == 1.0
    assert got["15.2.alibi-slopes"].measured == [f"1/{2**h}" for h in range(1, 9)]
    assert all(c.verdict == REPRODUCED for c in got.values())


def test_unseen_pairs_pattern():
    from llamablock.lab import exp_scaling

    c = exp_scaling.claim_unseen_pairs()
    # Pairs with wavelength 2 pi 10000^(2i/128) > 4096: i >= 46 (closed form), 18 of 64.
    assert c.measured["default"] == 18
    assert c.measured["yarn"] == 0 and c.measured["linear"] == 0 and c.measured["ntk"] > 0
    assert c.verdict == REPRODUCED
