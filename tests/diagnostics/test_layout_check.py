"""The q/k layout check (llamablock.diagnostics.layout_check, `llamablock rope layout`) on a real checkpoint.

Reference: SmolLM2-135M-Instruct as llamablock loads it, whose logits match transformers
(tests/io/test_gguf.py), so its rows are in the order its layout needs; the mix-up is made by
hand the way it happens, by leaving llama.cpp's row permutation in place (rope.permute_qk to
"interleaved") while the model rotates "half" pairs. On 128 tokens of Shakespeare the right order
scores 3.34 nats per token and the wrong ones 4.77-4.96 (measured 2026-11-30); the margin
asserted is 1 nat, twice the check's own 0.5.
"""

import pytest
import torch
from hf_reference import tiny_hf_model

import llamablock
from llamablock.cli import main
from llamablock.config import ModelConfig
from llamablock.diagnostics.layout_check import check_layout, permute_qk_rows
from llamablock.io.loading import load_model_and_tokenizer
from llamablock.model import Decoder
from llamablock.training.data import corpus_text


@pytest.fixture(scope="module")
def smol():
    model, tok = load_model_and_tokenizer(None)
    return model, torch.tensor([tok.encode(corpus_text()[:2000])[:128]])


def test_smollm2_as_loaded_is_consistent_and_restored(smol):
    model, ids = smol
    before = {n: p.clone() for n, p in model.named_parameters() if ".attn.w" in n}
    result = check_layout(model, ids)
    assert result.verdict == "consistent", result.message()
    assert result.loss_permuted - result.loss_as_loaded > 1.0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before)


def test_smollm2_with_the_converter_permutation_left_in_is_mixed_up(smol):
    model, ids = smol
    saved = permute_qk_rows(model, to="interleaved")  # W_q/W_k rows as the GGUF file stores them
    try:
        result = check_layout(model, ids)
    finally:
        for p, data in saved:
            p.data = data
    assert result.verdict == "mixed up"
    assert result.loss_as_loaded - result.loss_permuted > 1.0
    assert "permute_qk_rows(model, to='half')" in result.message()


def test_random_weights_are_undecided(tmp_path):
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path)
    model = llamablock.load_pretrained(tmp_path)
    result = check_layout(model, torch.randint(0, model.cfg.vocab_size, (1, 64)))
    assert result.verdict == "undecided", result.message()


def test_bad_input_is_a_clear_error(capsys):
    alibi = Decoder(ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=16, position="alibi"))
    with pytest.raises(ValueError, match="no RoPE pairs"):
        check_layout(alibi, torch.zeros(1, 32, dtype=torch.long))
    assert main(["rope", "layout", "--tokens", "4"]) == 2
    assert "--tokens must be at least 16" in capsys.readouterr().err


def test_cli_on_the_embedded_model(capsys):
    assert main(["rope", "layout", "--tokens", "64"]) == 0
    assert "q/k rows match the model's 'half' RoPE layout" in capsys.readouterr().out
