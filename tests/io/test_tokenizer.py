"""Tokenizers against transformers' tokenizer built from the same file (the reference).

Byte-level BPE: the SmolLM2 GGUF. SentencePiece-style BPE: a small vocabulary written to a GGUF
with gguf's writer (Llama 2 layout: <unk> <s> </s>, 256 byte tokens, pieces with scores, no
merges). transformers directory: the SmolLM2 tokenizer saved by transformers' save_pretrained.
"""

import gguf
import pytest

from llamablock.io.gguf import open_gguf
from llamablock.io.loading import load_tokenizer
from llamablock.io.resolve import resolve_model
from llamablock.io.tokenizer import tokenizer_from_dir, tokenizer_from_gguf

SMOL = resolve_model(None)
STRINGS = [
    "The capital of France is Paris.",
    "café, naïve, résumé, Ångström, Ελληνικά, Привет",
    "日本語のテキスト、中文字符和한국어",
    "emoji 😀👍🏽 and a flag 🇫🇷!",
    "   three leading spaces, then\ttabs\n\nand newlines  ",
    " one leading space",
    "numbers 12345, 3.14159 and 2026-11-29",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "x",
]
MESSAGES = [[{"role": "user", "content": "What is the capital of France?"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 👋"},
             {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Ça va ?"}]]


@pytest.fixture(scope="module")
def smol():
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(SMOL.parent, gguf_file=SMOL.name)
    return load_tokenizer(None), ref


@pytest.mark.parametrize("text", STRINGS)
def test_byte_level_gguf_matches_transformers(smol, text):
    ours, ref = smol
    ids = ours.encode(text)
    assert ids == ref.encode(text)
    assert ours.decode(ids) == ref.decode(ids) == text


@pytest.mark.parametrize("messages", MESSAGES)
def test_chat_template_matches_transformers(smol, messages):
    ours, ref = smol
    text = ours.apply_chat_template(messages)
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.encode(text) == ref.encode(text)
    assert ours.encode(text)[0] == 1  # <|im_start|> stays one special token


def test_special_ids_from_metadata(smol):
    ours, _ = smol
    assert ours.eos_ids == [2] and ours.token(2) == "<|im_end|>" and not ours.add_bos


def test_transformers_directory_matches(smol, tmp_path):
    ours, ref = smol
    ref.save_pretrained(tmp_path)
    from_dir = tokenizer_from_dir(tmp_path)
    for text in STRINGS:
        assert from_dir.encode(text) == ref.encode(text)
    assert from_dir.apply_chat_template(MESSAGES[0]) == ours.apply_chat_template(MESSAGES[0])


def _spm_gguf(path):
    pieces = ["\u2581", "t", "h", "e", "a", "c", "o", "s", "i", "n", "r", "\u2581t", "he", "\u2581the", "at", "\u2581c",
              "\u2581cat", "on", "\u2581on", "\u2581s", "\u2581sat", "in", "\u2581in", "\u2581a", "is", "\u2581is"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)  # UNKNOWN, CONTROL, BYTE, NORMAL (gguf TokenType)
    # Longer pieces score higher, so they merge first, as sentencepiece's BPE scores do.
    scores = [0.0] * (3 + 256) + [-100.0 + 10 * len(p) - i * 0.01 for i, p in enumerate(pieces)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


SPM_STRINGS = ["the cat sat on the mat", "This is it", "  two spaces", "café ☕", "the\nend", "thesis"]


def test_sentencepiece_gguf_matches_transformers(tmp_path):
    import transformers

    f = tmp_path / "spm.gguf"
    _spm_gguf(f)
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=f.name)
    ours = tokenizer_from_gguf(open_gguf(f))
    assert ours.add_bos and ours.bos_id == 1
    for text in SPM_STRINGS:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        back = ours.decode(ids, skip_special_tokens=True)
        assert back == ref.decode(ids, skip_special_tokens=True)
        # Decoding strips the one prefix space it assumes was added, so text that already began
        # with a space comes back one space short, in transformers as here.
        assert back == (text[1:] if text.startswith(" ") else text)


def test_no_chat_template_is_a_clear_error(tmp_path):
    f = tmp_path / "spm.gguf"
    _spm_gguf(f)
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer_from_gguf(open_gguf(f)).apply_chat_template(MESSAGES[0])


def test_a_character_record_listing_a_character_twice_is_refused():
    """Ids are positions in 'chars': a repeated character would give two ids one spelling and shift
    every id after it, so the record is refused, naming the character, rather than read wrongly."""
    from llamablock.io.llamablock_records import tokenizer_from_record

    with pytest.raises(ValueError, match=r"'chars' lists the character 'b' more than once") as e:
        tokenizer_from_record({"kind": "char", "chars": "abcb"})
    assert "\n" not in str(e.value)
    assert tokenizer_from_record({"kind": "char", "chars": "abc"}).encode("cab") == [2, 0, 1]


def test_a_character_record_out_of_sorted_order_is_refused():
    """Ids are places in sorted order (a resume sorts the characters again: training.data.CharTokenizer),
    so a record listing them otherwise would give an export and a resume different ids: refused."""
    from llamablock.io.llamablock_records import tokenizer_from_record

    with pytest.raises(ValueError, match=r"'chars' are not in sorted order \('c' before 'b'") as e:
        tokenizer_from_record({"kind": "char", "chars": "acb"})
    assert "\n" not in str(e.value)
