"""compare_to_reference: a format's distance from its float reference, as llama.cpp's --kl-divergence.

References: a model against itself (KL exactly 0, every top-1 equal, ratio 1); a perturbed copy
(KL > 0); torch's own F.kl_div on the same windows' log-probabilities for the value; and
sliding_perplexity for both perplexities (the same windows score the same tokens)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from hf_reference import tiny_hf_model

import llamablock
from llamablock.runtime.evaluate import (
    _windows,
    compare_to_reference,
    sliding_perplexity,
    token_losses,
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64).save_pretrained(d)
    model = llamablock.load_pretrained(d)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, other


IDS = torch.randint(0, 97, (150,), generator=torch.Generator().manual_seed(1)).tolist()


def test_a_model_against_itself_is_identical(pair):
    model, _ = pair
    r = compare_to_reference(model, model, IDS, context=48, stride=24)
    assert r["mean_kl"] == 0 and r["top1_agreement"] == 1 and r["perplexity_ratio"] == 1
    assert r["tokens_scored"] == len(IDS) - 1


def test_a_perturbed_copy_against_torchs_kl_div(pair):
    model, other = pair
    r = compare_to_reference(other, model, IDS, context=48, stride=24)
    assert r["mean_kl"] > 1e-4 and r["top1_agreement"] < 1
    x = torch.tensor(IDS)[None]
    kl, n = 0.0, 0
    with torch.no_grad():
        for begin, end, new in _windows(len(IDS), 48, 24):
            p = F.log_softmax(model(x[:, begin:end])[0, -new - 1:-1].double(), -1)
            q = F.log_softmax(other(x[:, begin:end])[0, -new - 1:-1].double(), -1)
            kl += F.kl_div(q, p, log_target=True, reduction="sum").item()  # KL(p || q)
            n += new
    assert r["mean_kl"] == pytest.approx(kl / n, rel=1e-9)
    for key, m in (("perplexity", other), ("reference_perplexity", model)):
        assert r[key] == pytest.approx(sliding_perplexity(m, IDS, 48, 24)[0], rel=1e-6)  # float64 here, float32 there


@pytest.mark.parametrize("chunk", [1, 7, 1024])
def test_chunked_token_losses_equal_the_one_shot_cross_entropy(pair, chunk):
    """token_losses applies the head a chunk at a time; the losses equal F.cross_entropy over the
    whole forward's logits (float32, the same operations per token: to 1e-6), at an offset too."""
    model, _ = pair
    ids = torch.tensor([IDS[:60]])
    for pos in (None, 40 + torch.arange(60)[None]):
        with torch.no_grad():
            want = F.cross_entropy(model(ids, position_ids=pos)[0, :-1], ids[0, 1:], reduction="none")
        got = token_losses(model, ids, pos, chunk=chunk)
        assert got.shape == (59,) and torch.allclose(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("n, context, stride", [(100, 20, 20), (100, 20, 7), (41, 20, 20), (20, 20, 20)])
def test_windows_score_each_target_once_with_history_in_the_window(n, context, stride):
    """Every scored target t (1..n-1) is predicted once, from a window that holds t - 1; with
    stride = context (no overlap) each later window's first token goes unscored, as in transformers'
    perplexity guide. A stride of the whole context crashed on a shape mismatch before."""
    scored = []
    for begin, end, new in _windows(n, context, stride):
        assert end - begin <= context and end - new - 1 >= begin  # the first target's history is in the window
        scored += range(end - new, end)
    assert len(scored) == len(set(scored)) and set(scored) <= set(range(1, n))
    unscored = set(range(1, n)) - set(scored)
    assert unscored == ({s for s in range(context, n, stride)} if stride == context else set())
