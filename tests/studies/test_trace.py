"""The token tracer: post-LN stages renormalized, pre-LN stages read where the block computes them."""

import json

import pytest
import torch

from llamablock.cli import main
from llamablock.model import Decoder
from llamablock.presets import preset
from llamablock.studies.trace import ensure_pair, trace_model, trace_pair
from llamablock.training.data import CharTokenizer, corpus_text
from llamablock.training.train import TrainConfig, init_weights

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"
TINY = dict(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64)


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer.train(corpus_text("tiny"))


def _model(name, tok, **kw):
    torch.manual_seed(0)
    m = Decoder(preset(name, **{**TINY, "vocab_size": tok.vocab_size, **kw}))
    init_weights(m)
    for p in m.parameters():  # move norms off their identity init so the affine matters
        if p.dim() == 1:
            p.data += 0.3 * torch.randn_like(p)
    # Unit-scale embeddings (torch's default N(0, 1) init), so eps = 1e-5 is small next to the
    # variance it is added to; at var 1e-3 the closed form var/(var + eps) is 0.99, not 1.
    torch.nn.init.normal_(m.embed.weight)
    return m.eval()


def test_post_ln_normalized_stages_have_mean_0_variance_1_per_token(tok):
    m = _model("gpt-2017-small", tok)
    t = trace_model(m, tok, TEXT)
    post = [s for s in t["stages"] if s["name"].startswith("block")]
    assert len(post) == 2 * TINY["n_layers"]
    for s in post:
        # Before the affine, LayerNorm output is (h - mean) / sqrt(var + eps): mean 0, var 1 - eps/(var+eps).
        assert max(abs(v) for v in s["normalized"]["mean"]) < 1e-4, s["name"]
        assert max(abs(v - 1) for v in s["normalized"]["var"]) < 1e-4, s["name"]
    # The stream itself carries gamma and beta, so it is not at (0, 1) here.
    assert max(abs(v - 1) for s in post for v in s["var"]) > 1e-2


def test_post_ln_stream_itself_is_reset_with_identity_affine(tok):
    m = _model("gpt-2017-small", tok)
    for layer in m.layers:
        for norm in (layer.norm1, layer.norm2):
            torch.nn.init.ones_(norm.weight)
            torch.nn.init.zeros_(norm.bias)
    for s in trace_model(m, tok, TEXT)["stages"]:
        if s["name"].startswith("block"):
            assert max(abs(v) for v in s["mean"]) < 1e-4
            assert max(abs(v - 1) for v in s["var"]) < 1e-4


def test_stages_are_where_the_blocks_compute_them(tok):
    m = _model("llama-2024-small", tok)
    t = trace_model(m, tok, TEXT)
    names = [s["name"] for s in t["stages"]]
    assert names[0] == "embeddings" and "+ positions" not in names  # RoPE: no position stage
    assert names[-2:] == ["final norm", "logits"]
    ids = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        assert torch.equal(t["logits"], m(ids)[0])
        # Block 1 by hand: x + attn(norm1(x)) is the stream after attention.
        pos = torch.arange(ids.shape[1])[None]
        x = m.embed(ids)
        x = x + m.layers[0].attn(m.layers[0].norm1(x), m.attention_inputs(pos))
    got = torch.tensor(t["stages"][1]["rms"], dtype=torch.float64)
    assert torch.allclose(got, x[0].double().pow(2).mean(-1).sqrt(), rtol=0, atol=1e-6)
    assert "+ positions" in [s["name"] for s in trace_model(_model("gpt-2017-small", tok), tok, TEXT)["stages"]]


def test_top_predictions_are_a_distribution(tok):
    t = trace_model(_model("llama-2024-small", tok), tok, TEXT, top_k=3)
    probs = [p["prob"] for p in t["top"]]
    assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6


def test_unknown_characters_are_a_clear_error(tok):
    with pytest.raises(ValueError, match="not in the vocabulary"):
        trace_model(_model("llama-2024-small", tok), tok, "café")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    # The real presets, trained only a few steps: the cache layout and loading are what is tested.
    d = tmp_path_factory.mktemp("cache")
    ensure_pair(d, recipe=TrainConfig(steps=3, batch_size=2, context=32, warmup=1, eval_every=3, eval_windows=2))
    return d


def test_trace_pair_uses_the_cache(cache):
    r = trace_pair(TEXT, cache_dir=cache)
    assert set(r["models"]) == {"2017", "2024"}
    assert r["models"]["2017"]["preset"] == "gpt-2017-small" and r["models"]["2024"]["steps"] == 3
    assert len(r["models"]["2017"]["tokens"]) == len(TEXT)
    json.dumps(r)  # plain data, ready for the web page


def test_trace_command_table_json_png(cache, tmp_path, capsys):
    png = tmp_path / "trace.png"
    assert main(["trace", "--text", TEXT, "--cache-dir", str(cache), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "block 4 after feed-forward" in out and "+ positions" in out and "next ->" in out
    assert png.stat().st_size > 1000
    assert main(["trace", "--text", "KING:", "--cache-dir", str(cache), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"]["2024"]["tokens"] == list("KING:")
    assert main(["trace", "--text", "", "--cache-dir", str(cache)]) == 2


def test_the_tracer_reads_a_sandwich_block_model():
    """Gemma 2's blocks (sandwich norms, soft-capping, mixed layers) through the same hooks: the stream
    after attention is norm2's input, after the feed-forward the block's output; the logits are the model's."""
    import torch

    from llamablock import Decoder, ModelConfig
    from llamablock.studies.trace import trace_model

    cfg = ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=2, family="gemma2", sandwich_norm=True,
                      norm_offset=1.0, ffn="geglu", attn_softcap=5.0, final_softcap=8.0, sliding_window=3,
                      layer_types=["sliding", "full"], qk_norm=True)
    torch.manual_seed(0)
    model = Decoder(cfg).eval()

    class Chars:
        def encode(self, text):
            return [ord(c) % 40 for c in text]

        def decode(self, ids):
            return "".join(chr(97 + i % 26) for i in ids)

    with torch.no_grad():
        result = trace_model(model, Chars(), "hello there")
        want = model(torch.tensor([Chars().encode("hello there")]))[0]
    names = [s["name"] for s in result["stages"]]
    assert names == ["embeddings", "block 1 after attention", "block 1 after feed-forward", "block 2 after attention",
                     "block 2 after feed-forward", "final norm", "logits"]
    assert torch.equal(result["logits"], want)
