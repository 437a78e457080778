"""The reference of `rope eval`: the unmodified model sliding in its own window
(runtime.evaluate.sliding_windows / sliding_token_losses, studies.context_extension.reference_losses)."""

import pytest
import torch
import torch.nn.functional as F
from hf_reference import tiny_hf_model

import llamablock
from llamablock.runtime.evaluate import (
    sliding_token_losses,
    sliding_windows,
    token_losses,
)
from llamablock.studies.context_extension import reference_losses


@pytest.mark.parametrize("n,context,stride", [(2, 2, 1), (50, 17, 4), (50, 17, 16), (64, 16, 5), (10, 40, 3),
                                              (1000, 129, 32)])
def test_sliding_windows_score_every_token_once_with_enough_history(n, context, stride):
    kept = []
    for begin, end, new in sliding_windows(n, context, stride):
        assert 0 <= begin < end <= n and end - begin <= context and 1 <= new <= end - begin - 1
        for p in range(end - new, end):  # target p, predicted from tokens begin..p-1
            assert p - begin >= min(p, context - stride)
            kept.append(p)
    assert kept == list(range(1, n))  # each target once, in order


def test_a_stride_as_long_as_the_window_is_refused():
    with pytest.raises(ValueError, match="stride < context"):  # a window's first target would see nothing
        sliding_windows(50, 17, 17)


def test_sliding_token_losses_equal_each_window_run_alone(tmp_path):
    """Against an independent computation: each kept target's loss from a plain forward of its window."""
    tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=16).save_pretrained(tmp_path)
    model = llamablock.load_pretrained(tmp_path)
    ids = torch.randint(0, 97, (1, 50))
    got = sliding_token_losses(model, ids, context=17, stride=4, chunk=3)
    for begin, end, new in sliding_windows(50, 17, 4):
        with torch.no_grad():
            logits = model(ids[:, begin:end])[0, :-1]  # predictions of tokens begin+1..end-1
        want = F.cross_entropy(logits, ids[0, begin + 1:end], reduction="none")[-new:]
        assert (got[end - new - 1:end - 1] - want).abs().max() <= 1e-5
    # Inside L the reference is the plain model: its first window holds positions 0..L-1.
    ref = reference_losses(model, ids, stride=4)
    assert (ref[:16] - token_losses(model, ids)[:16]).abs().max() <= 1e-5


def test_passkey_prompt_hides_the_key_at_its_depth_within_the_length():
    from gguf_tiny import tiny_vocab

    from llamablock.io.tokenizer import Tokenizer, byte_level_bpe
    from llamablock.studies.passkey import passkey_prompt

    tokens, merges = tiny_vocab(97)
    tok = Tokenizer(byte_level_bpe(tokens, merges, None), 0, [1])
    for depth in (0.1, 0.5, 0.9):
        ids = passkey_prompt(tok, 2000, depth, 12345)
        text = tok.decode(ids)
        assert 1900 <= len(ids) <= 2000 and text.endswith("The pass key is") and "12345" in text
        where = text.index("12345") / len(text)
        assert abs(where - depth) < 0.1
    with pytest.raises(ValueError, match="more than 50 tokens"):
        passkey_prompt(tok, 50, 0.5, 12345)


def test_default_documents_are_the_longest_plays_long_enough(monkeypatch):
    from gguf_tiny import tiny_vocab

    from llamablock.io.tokenizer import Tokenizer, byte_level_bpe
    from llamablock.studies.context_extension import shakespeare_documents
    from llamablock.training.data import list_plays, play_to_text

    tokens, merges = tiny_vocab(97)  # about a token per character
    tok = Tokenizer(byte_level_bpe(tokens, merges, None), 0, [1])
    docs = shakespeare_documents(tok, 150_000, 2)
    lengths = {f"{p.parent.name}/{p.stem}": len(play_to_text(p.read_text(encoding="utf-8"))) for p in list_plays("all")}
    longest = sorted(lengths, key=lengths.get, reverse=True)
    assert [name for name, _ in docs] == longest[:2] and all(len(ids) >= 150_000 for _, ids in docs)
    import llamablock.training.data as data

    monkeypatch.setattr(data, "list_plays", lambda corpus: list_plays(corpus)[:1])  # one play: quick to refuse
    with pytest.raises(ValueError, match="no packaged play has"):
        shakespeare_documents(tok, 10**7, 1)
