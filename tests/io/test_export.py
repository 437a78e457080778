"""Export of trained models (llamablock.io.export, io/export_gguf.py, `llamablock export`).

Tiny 2024 and 2017 models are trained for two steps into run directories. The references are
independent of llamablock's export code: transformers' AutoModelForCausalLM and AutoTokenizer
for the transformers directory (logits within 1e-4 in float32, over 200 positions), llamablock's
GGUF loader (the path every downloaded GGUF takes) for the GGUF file (identical logits), and
llama-cpp-python where installed (its tokenizer's ids, logits within 1e-3, greedy tokens; skipped
otherwise).
"""

from __future__ import annotations

import json

import pytest
import torch

from llamablock import cli
from llamablock.io.export import export_model, export_run
from llamablock.io.gguf import load_gguf
from llamablock.io.loading import load_model_and_tokenizer
from llamablock.io.resolve import latest_checkpoint, resolve_model
from llamablock.presets import preset
from llamablock.training.train import TrainConfig, train

TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;\n"
        "Or, if thou wilt not, be but sworn my love.\n")
TINY = TrainConfig(steps=2, batch_size=2, context=32, warmup=0, eval_every=2, eval_windows=2)


@pytest.fixture(scope="module")
def run2024(tmp_path_factory):
    run = tmp_path_factory.mktemp("run2024")
    result = train(preset("llama-2024-small"), TINY, run, progress=False)
    return run, result["model"].eval(), result["tokenizer"]


@pytest.fixture(scope="module")
def run2017(tmp_path_factory):
    run = tmp_path_factory.mktemp("run2017")
    result = train(preset("gpt-2017-small"), TINY, run, progress=False)
    return run, result["model"].eval(), result["tokenizer"]


def _ids(tok) -> torch.Tensor:
    ids = tok.encode(TEXT)
    assert len(ids) >= 200  # positions far from 0, where a RoPE mistake shows
    return torch.tensor([ids])


def test_hf_export_loads_in_transformers_with_equal_logits(run2024, tmp_path):
    transformers = pytest.importorskip("transformers")
    run, model, tok = run2024
    fmt, out = export_run(run, tmp_path / "hf", "hf")
    assert fmt == "hf" and {p.name for p in out.iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
        ".llamablock-export"}
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = _ids(tok)
    assert hf_tok(TEXT)["input_ids"] == ids[0].tolist() and hf_tok.decode(ids[0]) == TEXT
    with torch.no_grad():
        diff = (hf(ids).logits - model(ids)).abs().max().item()
    assert diff <= 1e-4, diff
    with torch.no_grad():  # and greedy decoding, token for token
        theirs = hf.generate(ids[:, :20], max_new_tokens=15, do_sample=False)[0, 20:].tolist()
    from llamablock.runtime.engine import EagerEngine
    from llamablock.runtime.generate import generate

    assert generate(EagerEngine(model), ids[0, :20].tolist(), 15).tokens == theirs


def test_train_writes_the_export_at_its_end(run2024, run2017):
    hf_conf = json.loads((run2024[0] / "export" / "config.json").read_text())
    assert hf_conf["model_type"] == "llama" and hf_conf["architectures"] == ["LlamaForCausalLM"]
    ours = json.loads((run2017[0] / "export" / "config.json").read_text())
    assert "model_type" not in ours and ours["position"] == "learned" and ours["norm_placement"] == "post"


def test_gguf_export_round_trips_with_identical_logits(run2024, tmp_path):
    run, model, tok = run2024
    fmt, f = export_run(run, tmp_path / "m.gguf", "gguf")
    ids = _ids(tok)
    with torch.no_grad():
        want = model(ids)
        same_layout = load_gguf(f, rope_layout="interleaved")  # the file's rows, as the model trained
        assert torch.equal(same_layout(ids), want)
        loaded, gguf_tok = load_model_and_tokenizer(f)  # what `generate --model m.gguf` runs
        assert (loaded(ids) - want).abs().max().item() <= 1e-5  # "half" layout: the same sums, reordered
    assert gguf_tok.encode(TEXT) == ids[0].tolist() and gguf_tok.decode(ids[0].tolist()) == TEXT
    from llamablock.runtime.engine import EagerEngine
    from llamablock.runtime.generate import generate

    assert generate(EagerEngine(loaded), ids[0, :20].tolist(), 15).tokens == generate(EagerEngine(model), ids[0, :20].tolist(), 15).tokens


def test_gguf_export_runs_in_llama_cpp(run2024, tmp_path):
    """llama.cpp's own tokenizer and kernels: the same ids, logits at every prompt position within
    1e-3 (its float32 matmuls sum in another order), the same greedy tokens."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    import numpy as np

    run, model, tok = run2024
    _, f = export_run(run, tmp_path / "m.gguf", "gguf")
    llm = llama_cpp.Llama(model_path=str(f), n_ctx=model.cfg.max_seq_len, logits_all=True, verbose=False)
    prompt = tok.encode(TEXT)
    assert llm.tokenize(TEXT.encode(), add_bos=False, special=False) == prompt
    llm.eval(prompt)
    with torch.no_grad():
        ours = model(torch.tensor([prompt]))[0].numpy()
    assert np.abs(np.asarray(llm.scores[: len(prompt)]) - ours).max() <= 1e-3
    theirs = []
    llm.reset()
    for t in llm.generate(prompt[:20], temp=0.0, top_k=1):
        theirs.append(t)
        if len(theirs) == 10:
            break
    from llamablock.runtime.engine import EagerEngine
    from llamablock.runtime.generate import generate

    assert generate(EagerEngine(model), prompt[:20], 10).tokens == theirs


def test_2017_model_exports_as_a_llamablock_directory(run2017, tmp_path):
    run, model, tok = run2017
    with pytest.raises(ValueError, match="learned positions.*llamablock directory"):
        export_run(run, tmp_path / "hf", "hf")
    with pytest.raises(ValueError, match="cannot be exported as gguf"):
        export_run(run, tmp_path / "m.gguf", "gguf")
    fmt, out = export_run(run, tmp_path / "ours")
    assert fmt == "llamablock"
    loaded, loaded_tok = load_model_and_tokenizer(out)
    ids = _ids(tok)
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
    assert loaded_tok.encode(TEXT) == ids[0].tolist()


def test_a_run_directory_loads_its_latest_checkpoint(run2024):
    run, model, tok = run2024
    assert resolve_model(run) == latest_checkpoint(run)
    loaded, loaded_tok = load_model_and_tokenizer(run)
    ids = _ids(tok)
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
    assert loaded_tok.decode(ids[0].tolist()) == TEXT


def test_export_replaces_a_previous_export_whole(run2024, tmp_path):
    """An earlier export (its marker file says so) is replaced whole; a foreign folder is refused
    (tests/io/test_export_ownership.py)."""
    out = tmp_path / "hf"
    export_model(run2024[1], run2024[2].to_dict(), out, "hf")
    (out / "stale.bin").write_text("old")
    export_model(run2024[1], run2024[2].to_dict(), out, "hf")
    assert not (out / "stale.bin").exists() and (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_export_command(run2024, run2017, tmp_path, capsys):
    assert cli.main(["export", str(run2024[0]), str(tmp_path / "a")]) == 0
    assert "(hf)" in capsys.readouterr().out
    assert cli.main(["export", str(run2017[0]), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "(llamablock)" in out and "no transformers or llama.cpp architecture" in out
    assert cli.main(["export", str(run2024[0]), str(tmp_path / "c"), "--format", "gguf"]) == 2
    assert "ending in .gguf" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "nothing"), str(tmp_path / "d")]) == 2


def test_generate_runs_the_export_that_train_wrote(run2024, capsys):
    """The 2024 run's export/ is a transformers directory, which `generate --model` reads today."""
    run, model, tok = run2024
    code = cli.main(["generate", "--model", str(run / "export"), "--prompt", "ROMEO:", "--max-new-tokens", "8",
                     "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    from llamablock.runtime.engine import EagerEngine
    from llamablock.runtime.generate import generate

    assert json.loads(out)["tokens"] == generate(EagerEngine(model), tok.encode("ROMEO:"), 8).tokens


@pytest.mark.parametrize("which", ["run2024", "run2017"])
def test_generate_and_perplexity_take_a_run_directory(which, request, tmp_path, capsys):
    run, model, tok = request.getfixturevalue(which)
    code = cli.main(["generate", "--model", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "5", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    from llamablock.runtime.engine import EagerEngine
    from llamablock.runtime.generate import generate

    assert json.loads(out)["tokens"] == generate(EagerEngine(model), tok.encode("ROMEO:"), 5).tokens
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    assert cli.main(["perplexity", str(text), "--model", str(run), "--context", "64", "--json"]) == 0


def test_a_byte_level_bpe_run_exports_its_tokenizer_to_both_formats(tmp_path):
    """`--tokenizer bpe`: tokenizer.json is the trained one; GGUF gets its vocabulary and merges."""
    transformers = pytest.importorskip("transformers")
    t = TrainConfig(steps=2, batch_size=2, context=32, warmup=0, eval_every=2, eval_windows=2, tokenizer="bpe",
                    bpe_vocab=300)
    result = train(preset("llama-2024-small"), t, tmp_path / "run", progress=False)
    ids = result["tokenizer"].encode(TEXT)
    _, hf_dir = export_run(tmp_path / "run", tmp_path / "hf", "hf")
    assert transformers.AutoTokenizer.from_pretrained(hf_dir)(TEXT)["input_ids"] == ids
    _, f = export_run(tmp_path / "run", tmp_path / "m.gguf", "gguf")
    loaded, tok = load_model_and_tokenizer(f)
    assert tok.encode(TEXT) == ids and tok.decode(ids) == TEXT
    x = torch.tensor([ids])
    with torch.no_grad():
        assert (loaded(x) - result["model"].eval()(x)).abs().max().item() <= 1e-5
