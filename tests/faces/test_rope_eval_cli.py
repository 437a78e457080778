"""`llamablock rope eval` end to end on a tiny GGUF model (trained context 16) and a tiny text:
the JSON object's fields, the plot written, the cache reused on a second run, bad flags refused."""

from __future__ import annotations

import json

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock import cli

ALL = ["none", "linear", "ntk", "dynamic", "dynamic-consistent", "yarn", "yarn-no-factor", "llama3", "self-extend",
       "sinks"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("rope-eval")
    write_tiny_gguf(d / "tiny.gguf", tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=16))
    (d / "a.txt").write_text("To be, or not to be, that is the question: whether 'tis nobler in the mind. " * 2)
    (d / "b.txt").write_text("Now is the winter of our discontent made glorious summer by this sun of York. " * 2)
    return d


def _run(capsys, files, *extra):
    argv = ["rope", "eval", "--model", str(files / "tiny.gguf"), "--text", str(files / "a.txt"), "--text",
            str(files / "b.txt"), "--tokens", "48", "--bin", "8", "--cache-dir", str(files / "cache"), *extra]
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out


def test_the_commands_list_is_the_studys():  # kept apart so that `--help` imports no torch
    from llamablock.commands.rope_eval import ALL as listed
    from llamablock.studies.context_extension import METHODS

    assert tuple(listed) == METHODS == tuple(ALL)


def test_json_plot_and_cache(capsys, files):
    code, out = _run(capsys, files, "--json", "--plot", str(files / "p.png"))
    assert code == 0, out.err
    r = json.loads(out.out)
    assert (r["trained_context"], r["tokens"], r["factor"], r["stride"]) == (16, 48, 3.0, 4)
    assert set(r["methods"]) == set(ALL) | {"reference"}
    for m in r["methods"].values():
        assert [(b["start"], b["end"]) for b in m["bins"]] == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40), (40, 47)]
        assert all(b["nll"] > 0 for b in m["bins"]) and set(m["perplexity"]) == {"inside_L", "L_to_2L", "beyond_2L"}
    # Inside L the plain model is the reference itself (its first window holds positions 0..L-1),
    # and so are both dynamic NTK methods, read a piece at a time as a generation reads them.
    ppl = {m: v["perplexity"] for m, v in r["methods"].items()}
    for m in ("none", "dynamic", "dynamic-consistent"):
        assert ppl[m]["inside_L"] == pytest.approx(ppl["reference"]["inside_L"], rel=1e-5)
    # Past L a method changes the losses.
    assert ppl["linear"]["beyond_2L"] != pytest.approx(ppl["none"]["beyond_2L"], rel=1e-4)
    assert (files / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r["cache"] == {"hits": 0, "computed": 2 * 11} and r["seconds"] >= 0
    code, out = _run(capsys, files, "--json")  # the second run reads every pass from the cache
    again = json.loads(out.out)
    assert again["cache"] == {"hits": 22, "computed": 0} and again["methods"] == r["methods"]
    code, out = _run(capsys, files, "--methods", "none,yarn")  # the text table
    assert code == 0 and "yarn" in out.out and "inside_L" in out.out and "6 passes read, 0 computed" in out.out


@pytest.mark.parametrize("extra,message", [
    (["--methods", "none,rope2"], "--methods: unknown rope2"),
    (["--tokens", "500"], "fewer than --tokens 500"),
    (["--factor", "0.5"], "--factor must be a number >= 1"),
    (["--stride", "17"], "--stride must be at most the trained context 16"),
])
def test_bad_input_is_one_line(capsys, files, extra, message):
    code, out = _run(capsys, files, *extra)
    assert code == 2 and message in out.err and len(out.err.strip().splitlines()) == 1


def test_passkey_plumbing(capsys, tmp_path):
    """The task's plumbing on a random tiny model (its accuracy means nothing): prompts of the asked
    lengths, every method answered, and the control's verdict on a model that cannot find the key."""
    write_tiny_gguf(tmp_path / "t.gguf", tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=512))
    code = cli.main(["rope", "eval", "--task", "passkey", "--model", str(tmp_path / "t.gguf"), "--tokens", "1024",
                     "--methods", "none,yarn,sinks", "--trials", "1", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    r = json.loads(out.out)
    assert r["lengths"] == [256, 512, 1024] and set(r["methods"]) == {"none", "yarn", "sinks"}
    assert all(set(acc) == {"256", "512", "1024"} and all(0 <= a <= 1 for a in acc.values()) for acc in r["methods"].values())
    assert set(r["control"]) == {"256", "512"}
    assert r["verdict"].startswith("not measurable") == (min(r["control"].values()) < 0.5)
