"""Tokenizers for real checkpoints, built on the `tokenizers` library, with jinja2 chat templates.

Two sources:
  * GGUF metadata (`tokenizer.ggml.*`). llama.cpp stores the vocabulary, merges, token types and
    the name of the pre-tokenizer, not a tokenizer.json, so the pipeline is rebuilt here:
      - "gpt2" (byte-level BPE: SmolLM2, Qwen, Llama 3): BPE over bytes spelled with GPT-2's
        byte-to-unicode table; the text is first split by the regex that `tokenizer.ggml.pre`
        names (the table below restates llama.cpp's `llama-vocab.cpp` per pre-tokenizer type);
      - "llama" (SentencePiece BPE: Llama 2, Mistral, Gemma): spaces become U+2581 and a prefix
        U+2581 is added (transformers' rule, see `sentencepiece_bpe`); merges come from the file or, when it has none, are rebuilt from the
        vocabulary ranked by score; unknown bytes fall back to <0xXX> tokens.
    Tokens typed CONTROL (3) are special tokens and USER_DEFINED (4) added tokens, matched whole.
  * A transformers directory: tokenizer.json plus tokenizer_config.json (chat template, specials).
The chat template is rendered as transformers renders it: a sandboxed jinja2 environment with
trim_blocks and lstrip_blocks, `raise_exception` and a `tojson` filter, within bounds of size and
steps (llamablock.io.chat_template).
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from llamablock.io.resolve import read_json
from llamablock.util.reads import (
    MAX_JSON,
    MAX_TEMPLATE,
    read_text_bounded,
    regular_file,
)

# llama.cpp llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_*: how text is split before byte-level BPE.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# pre name -> list of split regexes applied in turn ("\p{N}" first = every digit its own piece)
PRE_SPLITS = {
    "default": [_GPT2_SPLIT], "gpt2": [_GPT2_SPLIT],
    "smollm": [r"\p{N}", _GPT2_SPLIT], "starcoder": [r"\p{N}", _GPT2_SPLIT], "refact": [r"\p{N}", _GPT2_SPLIT],
    "llama3": [_LLAMA3_SPLIT], "llama-bpe": [_LLAMA3_SPLIT], "smaug-bpe": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT], "deepseek-r1-qwen": [_QWEN2_SPLIT],
}
CONTROL, USER_DEFINED = 3, 4


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (openai/gpt-2 encoder.py)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


class Tokenizer:
    """encode / decode / apply_chat_template over a `tokenizers.Tokenizer`."""

    def __init__(self, backend: Backend, bos_id: int | None, eos_ids: list[int], pad_id: int | None = None,
                 add_bos: bool = False, chat_template: str | None = None, template_source: str | None = None):
        self.backend, self.bos_id, self.eos_ids = backend, bos_id, list(eos_ids)
        self.pad_id = pad_id if pad_id is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.add_bos, self.chat_template = add_bos, chat_template
        self.template_source = template_source  # where the template was read (for error messages)

    @property
    def max_token_chars(self) -> int | None:
        """The most characters one token covers (its longest spelling), or None when a normalizer
        may shrink text before it is split: with it, a text longer than context x this many
        characters cannot fit, and the server refuses it without tokenizing."""
        if self.backend.normalizer is not None:
            return None
        if getattr(self, "_max_token_chars", None) is None:
            self._max_token_chars = max((len(t) for t in self.backend.get_vocab()), default=1)
        return self._max_token_chars

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token(self, i: int) -> str | None:
        return self.backend.id_to_token(i)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            isolated: bool = False) -> str:
        """The messages through the model's chat template (llamablock.io.chat_template: the sandbox
        transformers uses, with bounds on size, steps and arithmetic). `isolated`: in a child
        process with a time and memory limit (the server's choice: a model file's template must not
        be able to freeze it)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use a plain prompt instead of --chat")
        from llamablock.io.chat_template import RenderFailed, render, render_isolated

        special = {"bos_token": self.token(self.bos_id) if self.bos_id is not None else "",
                   "eos_token": self.token(self.eos_ids[0]) if self.eos_ids else ""}
        where = f" (the template is {self.template_source})" if self.template_source else ""
        try:
            return (render_isolated if isolated else render)(self.chat_template, special, messages,
                                                             add_generation_prompt)
        except RenderFailed as e:  # already "<type>: <message>", from the child
            raise ValueError(f"the model's chat template failed: {e}{where}") from None
        except Exception as e:  # its own raise_exception, a syntax error, an undefined name, a bound passed
            raise ValueError(f"the model's chat template failed: {type(e).__name__}: {e}{where}") from None


def _add_typed_tokens(backend: Backend, tokens: list[str], types: list[int] | None) -> None:
    if not types:
        return
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, k in zip(tokens, types, strict=True) if k == CONTROL])
    backend.add_tokens([AddedToken(t, normalized=False, special=False)
                        for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED])


def byte_level_bpe(tokens: list[str], merges: list[str], pre: str | None, types: list[int] | None = None) -> Backend:
    """Byte-level BPE (GPT-2 style) from a GGUF vocabulary."""
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # A few files store tokens as raw text rather than byte spelling; respell those.
    vocab = {(t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = Backend(models.BPE(vocab, pairs, ignore_merges=pre in ("llama3", "llama-bpe")))
    splits = PRE_SPLITS.get(pre or "default")
    if splits is None:
        raise ValueError(f"tokenizer.ggml.pre is {pre!r}, a pre-tokenizer llamablock does not know; known: "
                         f"{', '.join(sorted(PRE_SPLITS))}")
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    _add_typed_tokens(backend, tokens, types)
    return backend


MAX_PIECE_CHARS = 1024  # characters of one SentencePiece token: real vocabularies stay under ~100


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE files list no merges: every split of a token into two vocabulary pieces
    is a merge, ranked by the merged token's score (higher first), as sentencepiece applies them.
    Splitting costs the square of a token's length, so a token past MAX_PIECE_CHARS is refused (a
    1,000,000-character one hung the loader)."""
    longest = max(range(len(tokens)), key=lambda i: len(tokens[i]), default=None)
    if longest is not None and len(tokens[longest]) > MAX_PIECE_CHARS:
        raise ValueError(f"tokenizer.ggml.tokens[{longest}] has {len(tokens[longest]):,} characters, more than the "
                         f"{MAX_PIECE_CHARS:,} a SentencePiece token may have here; the vocabulary is damaged or not "
                         "a SentencePiece one")
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for t, i in vocab.items():
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab:
                found.append((scores[i], vocab[a], vocab[b], a, b))
    found.sort(key=lambda m: (-m[0], m[1], m[2]))
    return [(a, b) for _, _, _, a, b in found]


def sentencepiece_bpe(tokens: list[str], scores: list[float], merges: list[str] | None, unk_id: int,
                      types: list[int] | None = None, add_space_prefix: bool = True) -> Backend:
    """SentencePiece-style BPE (Llama 2, Mistral, Gemma) with byte fallback."""
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges] if merges else _merges_from_scores(tokens, scores)
    backend = Backend(models.BPE(vocab, pairs, unk_token=tokens[unk_id], byte_fallback=True, fuse_unk=True))
    # Spaces -> U+2581 and one U+2581 prefix unless the text already starts with a space: the
    # Metaspace rule transformers builds for these files. llama.cpp always prefixes, so text that
    # starts with spaces gets one more U+2581 there ("  a": transformers "\u2581\u2581a", llama.cpp three).
    scheme = "first" if add_space_prefix else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    _add_typed_tokens(backend, tokens, types)
    return backend


def _file_of(reader) -> str:
    """The path of the file a GGUF reader maps (its byte view's memory map names it), for messages."""
    view = getattr(reader, "data", None)
    while view is not None:
        if isinstance(getattr(view, "filename", None), (str, Path)):
            return str(view.filename)
        view = getattr(view, "base", None)
    return "the GGUF file"


def tokenizer_from_gguf(reader) -> Tokenizer:
    from llamablock.io.gguf_meta import field_array
    from llamablock.io.gguf_meta import read_metadata as metadata

    name = _file_of(reader)
    meta = metadata(reader)
    kind = meta.get("tokenizer.ggml.model")
    tokens = field_array(reader, "tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise ValueError(f"{name} has no tokenizer (no tokenizer.ggml.model / tokens)")

    def token_id(key: str, default=None) -> int | None:
        v = meta.get(key, default)
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < len(tokens)):
            raise ValueError(f"{name}: {key} must be a token id below the {len(tokens)} tokens, got {v!r}")
        return None if v is None else int(v)

    def flag(key: str, default: bool) -> bool:
        v = meta.get(key, default)
        if not isinstance(v, (bool, numbers.Integral)):
            raise ValueError(f"{name}: {key} must be true or false, got {v!r}")
        return bool(v)

    types = field_array(reader, "tokenizer.ggml.token_type")
    merges = field_array(reader, "tokenizer.ggml.merges")
    scores = field_array(reader, "tokenizer.ggml.scores")
    for key, per_token in (("tokenizer.ggml.token_type", types), ("tokenizer.ggml.scores", scores)):
        if per_token is not None and len(per_token) != len(tokens):  # one entry per token, as llama.cpp reads them
            raise ValueError(f"{name}: {key} has {len(per_token)} entries for {len(tokens)} tokens; the file is "
                             "inconsistent (one per token)")
    try:
        if kind == "gpt2":
            backend = byte_level_bpe(tokens, merges or [], meta.get("tokenizer.ggml.pre"), types)
            add_bos = flag("tokenizer.ggml.add_bos_token", False)
        elif kind == "llama":
            backend = sentencepiece_bpe(tokens, scores or [0.0] * len(tokens), merges, token_id("tokenizer.ggml.unknown_token_id", 0),
                                        types, flag("tokenizer.ggml.add_space_prefix", True))
            add_bos = flag("tokenizer.ggml.add_bos_token", True)  # llama.cpp's default for spm
        else:
            raise ValueError(f"tokenizer.ggml.model is {kind!r}, which is not supported; supported: 'gpt2' "
                             "(byte-level BPE), 'llama' (SentencePiece BPE)")
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    except Exception as e:  # the tokenizers library raises a bare Exception on malformed merges
        raise ValueError(f"{name}: its tokenizer (tokenizer.ggml.tokens / merges) is unreadable: {e}") from None
    eos = [token_id(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{name}: tokenizer.chat_template must be a string, got {template!r}")
    pad = meta.get("tokenizer.ggml.padding_token_id")  # only batching pads; an id out of range means none
    pad = int(pad) if isinstance(pad, numbers.Integral) and 0 <= pad < len(tokens) else None
    return Tokenizer(backend, token_id("tokenizer.ggml.bos_token_id"), list(dict.fromkeys(eos)), pad, add_bos, template,
                     f"{name}'s tokenizer.chat_template")


def tokenizer_from_dir(path: str | Path) -> Tokenizer:
    """tokenizer.json (+ tokenizer_config.json) of a transformers checkpoint directory."""
    path = Path(path)
    f = path / "tokenizer.json"
    if not os.path.lexists(f):
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    regular_file(f, "tokenizer.json", MAX_JSON)  # the library opens it: a FIFO would block it for ever
    try:
        backend = Backend.from_file(str(f))
    except Exception as e:  # the tokenizers library raises a bare Exception on a malformed file
        raise ValueError(f"{f} is not a readable tokenizer.json: {e}") from None
    conf_file = path / "tokenizer_config.json"
    conf = read_json(conf_file) if os.path.lexists(conf_file) else {}
    template, source = _chat_template(conf.get("chat_template"), conf_file), f"{conf_file}'s chat_template"
    jinja = path / "chat_template.jinja"
    if template is None and os.path.lexists(jinja):
        template, source = read_text_bounded(jinja, MAX_TEMPLATE, "chat template"), str(jinja)

    def tid(key):
        tok = conf.get(key)
        tok = tok.get("content") if isinstance(tok, dict) else tok
        if tok is not None and not isinstance(tok, str):
            raise ValueError(f"{conf_file}: {key} must be a token (a string, or {{\"content\": string}}), got "
                             f"{conf.get(key)!r}")
        return backend.token_to_id(tok) if tok else None

    eos = tid("eos_token")
    add_bos = conf.get("add_bos_token", False)
    if add_bos is not None and not isinstance(add_bos, bool):
        raise ValueError(f"{conf_file}: add_bos_token must be true or false, got {add_bos!r}")
    # tokenizer.json's post-processor may add BOS itself; ours adds it only when the config says so.
    backend.no_padding()
    backend.post_processor = None
    return Tokenizer(backend, tid("bos_token"), [eos] if eos is not None else [], tid("pad_token"),
                     bool(add_bos), template, source)


def _chat_template(template, conf_file: Path) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of {"name", "template"} of which
    the one named "default" is used (as transformers does)."""
    if template is None or isinstance(template, str):
        return template
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)} \
        if isinstance(template, list) else None
    if named is None or not all(isinstance(t, str) for t in named.values()):
        raise ValueError(f"{conf_file}: chat_template must be a string or a list of {{\"name\", \"template\"}} "
                         f"objects, got {str(template)[:60]}")
    if "default" not in named:
        raise ValueError(f"{conf_file}: chat_template lists templates named {sorted(map(str, named))} but none named "
                         "'default', the one a chat uses")
    return named["default"]
