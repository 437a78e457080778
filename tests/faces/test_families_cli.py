"""The descendants through the command line: `generate` and `perplexity` on transformers directories
of Qwen3, Gemma 2, Gemma 3 and Phi-3 (tiny random models with a character tokenizer).

Greedy ids must equal transformers' own greedy generation from the same directory (eager
attention, float32), and perplexity must equal exp of transformers' mean cross-entropy.
"""

import json
import math
import string

import pytest
import torch
from hf_reference import tiny_hf_model

from llamablock.cli import main

CHARS = string.ascii_lowercase + " .,"
FAMILIES = {"qwen3": dict(n_heads=4, n_kv=2), "gemma2": dict(n_heads=4, n_kv=2, sliding_window=6),
            "gemma3_text": dict(n_heads=4, n_kv=1, sliding_window=6), "phi3": dict(n_heads=4, n_kv=4, sliding_window=6)}


def _char_tokenizer(path):
    """tokenizer.json of a one-character-per-token WordLevel vocabulary (ids 0..len(CHARS)-1)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(CHARS)}, unk_token=" "))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = tiny_hf_model(request.param, **FAMILIES[request.param])
    hf.save_pretrained(path)
    _char_tokenizer(path)
    return path, hf


def test_generate_gives_transformers_greedy_ids(capsys, family_dir):
    path, hf = family_dir
    prompt = "the cat sat on"
    assert main(["generate", "--model", str(path), "--prompt", prompt, "--greedy", "--max-new-tokens", "12",
                 "--json", "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    ids = torch.tensor([[CHARS.index(c) for c in prompt]])
    with torch.no_grad():
        # An explicit mask: transformers would take the prompt's token 0 ("a") for padding.
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                          eos_token_id=None)[0, ids.shape[1]:]
    assert out["tokens"] == ref.tolist()


def test_perplexity_equals_transformers_cross_entropy(capsys, family_dir, tmp_path):
    path, hf = family_dir
    text = "a quiet sea, a bright moon. the ship sails on and on " * 2
    (tmp_path / "t.txt").write_text(text)
    n = len(text)  # one window over the whole text, longer than every window of the sliding layers
    assert main(["perplexity", "--model", str(path), str(tmp_path / "t.txt"), "--context", str(n), "--stride",
                 str(n), "--json", "--threads", "1"]) == 0
    got = json.loads(capsys.readouterr().out)
    ids = torch.tensor([[CHARS.index(c) for c in text]])
    with torch.no_grad():
        loss = hf(ids, labels=ids).loss.item()
    assert got["perplexity"] == pytest.approx(math.exp(loss), rel=1e-4)
