"""GGUF files of the block's descendants, written as llama.cpp's converter writes them (gguf_families_tiny),
loaded by llamablock and by transformers' own GGUF loader from the same file.

Tolerance: max |logit difference| <= 1e-4 in float32 against the transformers model the file was
written from, and against transformers reading the file; greedy ids equal. transformers' GGUF reader
leaves some of a file's settings at its config defaults, so those are given to it explicitly, each
said where it is: Qwen3's and Gemma's head width (it reads no key_length for them) and Gemma's
query_pre_attn_scalar (llama.cpp's rule: the head width); Phi-3's window (llama.cpp reads it, transformers'
reader does not) and pad id (its default is outside a 97-token vocabulary). LongRoPE's factor tensors it does not read at all, and Gemma 1 files not at all,
so those are compared with the model they were written from only.
"""

import pytest
import torch
import transformers
from gguf_families_tiny import write_family_gguf
from hf_reference import tiny_hf_model

from llamablock.io.gguf import config_from_gguf, load_gguf, open_gguf
from llamablock.io.loading import load_model_and_tokenizer

LONG = dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.3, 2.0, 4.0],
                             "long_factor": [1.5, 3.0, 7.0, 16.0]},
            original_max_position_embeddings=16, max_position_embeddings=4096)
CASES = {
    "qwen3": ("qwen3", dict(n_heads=4, n_kv=2), dict(head_dim=16)),
    # Gemma 1: transformers' GGUF reader has no `gemma` architecture, so against the source model only.
    "gemma": ("gemma", dict(n_heads=4, n_kv=1, tied=True), None),
    "gemma2": ("gemma2", dict(n_heads=4, n_kv=2, sliding_window=6, tied=True, query_pre_attn_scalar=16),
               dict(head_dim=16, query_pre_attn_scalar=16)),
    "gemma3": ("gemma3_text", dict(n_heads=4, n_kv=1, sliding_window=6, num_hidden_layers=6, query_pre_attn_scalar=16),
               dict(head_dim=16, query_pre_attn_scalar=16)),
    "phi3-window": ("phi3", dict(n_heads=4, n_kv=2, sliding_window=6), dict(pad_token_id=0, sliding_window=6)),
    "phi3-longrope": ("phi3", dict(n_heads=4, n_kv=2, **LONG), None),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def written(request, tmp_path_factory):
    family, kw, hf_overrides = CASES[request.param]
    hf = tiny_hf_model(family, **kw)
    path = tmp_path_factory.mktemp(request.param) / "m.gguf"
    write_family_gguf(path, hf, family)
    return request.param, hf, path, hf_overrides


def test_logits_match_the_source_and_transformers_reading_the_file(written):
    name, hf, path, overrides = written
    ours = load_gguf(path)
    assert ours.cfg.family == CASES[name][0]
    ids = torch.randint(0, 97, (2, 24))  # past every window (6) and Phi-3's original length (16)
    with torch.no_grad():
        got = ours(ids)
        assert (got - hf(ids).logits).abs().max().item() <= 1e-4
        if overrides is not None:
            back = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, attn_implementation="eager", **overrides).eval()
            ref = back(ids).logits
            assert (got - ref).abs().max().item() <= 1e-4
            assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_the_config_reads_what_the_family_adds(written):
    name, hf, path, _ = written
    cfg = config_from_gguf(open_gguf(path))
    if name == "gemma2":
        assert (cfg.attn_softcap, cfg.final_softcap, cfg.layer_kinds[:2]) == (50.0, 30.0, ["sliding", "full"])
    if name == "gemma3":
        assert cfg.layer_kinds == ["sliding"] * 5 + ["full"] and cfg.local_rope_theta == 10_000.0 and cfg.qk_norm
    if name == "phi3-longrope":
        assert cfg.rope_scaling["rope_type"] == "longrope" and cfg.rope_scaling["original_max_position_embeddings"] == 16


def test_generate_runs_the_file_in_its_own_precision(written):
    """The runtime loader (`--dtype auto`, the packed formats) reads the same file: F32 here, so float32."""
    _, hf, path, _ = written
    model, tok = load_model_and_tokenizer(str(path))
    ids = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() <= 1e-4


def test_a_quantized_file_matches_transformers_dequantizing_it(tmp_path):
    hf = tiny_hf_model("qwen3", n_heads=4, n_kv=2, intermediate_size=64, hidden_size=64)
    write_family_gguf(tmp_path / "q.gguf", hf, "qwen3", qtype="Q8_0")
    ours = load_gguf(tmp_path / "q.gguf")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q.gguf", head_dim=16,
                                                             attn_implementation="eager").eval()
    ids = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        got, ref = ours(ids), back(ids).logits
    assert (got - ref).abs().max().item() <= 1e-4 and torch.equal(got.argmax(-1), ref.argmax(-1))


def test_a_gemma_file_without_its_window_is_refused_by_name(tmp_path):
    import gguf

    hf = tiny_hf_model("gemma2", n_heads=4, n_kv=2, sliding_window=6, tied=True)
    write_family_gguf(tmp_path / "g.gguf", hf, "gemma2")
    reader = open_gguf(tmp_path / "g.gguf")
    del reader.fields[f"gemma2.{gguf.Keys.Attention.SLIDING_WINDOW.split('.', 1)[1]}"]
    with pytest.raises(ValueError, match="lacks gemma2.attention.sliding_window"):
        config_from_gguf(reader)


GEMMA_TEMPLATE = (  # Gemma's turn format as its tokenizer_config.json writes it (system folded into the first turn)
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}"
    "{% endif %}{% for message in loop_messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix "
    "if loop.first else '') }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def test_gemma_sentencepiece_vocabulary_and_turn_template_match_transformers(tmp_path):
    """A Gemma 3 GGUF's tokenizer: SentencePiece pieces without the space prefix, control tokens for
    the turns, its template; transformers' GGUF tokenizer reads the same file."""
    import gguf

    from llamablock.io.tokenizer import tokenizer_from_gguf

    pieces = ["\u2581", "t", "h", "e", "a", "c", "o", "s", "i", "n", "r", "\u2581t", "he", "\u2581the", "at", "\u2581c",
              "\u2581cat", "on", "\u2581on", "\u2581s", "\u2581sat", "in", "\u2581in", "\u2581a", "is", "\u2581is"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"] + \
        [f"<0x{b:02X}>" for b in range(256)] + pieces
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * (6 + 256) + [-100.0 + 10 * len(p) - i * 0.01 for i, p in enumerate(pieces)])
    w.add_token_types([3, 3, 3, 2, 4, 4] + [6] * 256 + [1] * len(pieces))  # CONTROL, UNKNOWN, USER_DEFINED, BYTE, NORMAL
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.add_chat_template(GEMMA_TEMPLATE)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = tokenizer_from_gguf(open_gguf(tmp_path / "g.gguf"))
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="g.gguf")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " the cat sat "}]
    text = ours.apply_chat_template(messages)
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<end_of_turn>\n<start_of_turn>model\n")
    for s in ("the cat sat on the mat", text, "  two"):
        assert ours.encode(s) == ref.encode(s), s
