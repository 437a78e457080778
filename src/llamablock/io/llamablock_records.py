"""llamablock's own records, read: a training tokenizer record and a ModelConfig dict.

A checkpoint's state.json and a llamablock export's config.json hold these; the checks
(io/checkpoint_state.py), the readers (io/llamablock_dir.py) and the exporter (io/export.py) all
turn them into objects here, one way, with errors that name the file and the field.
"""

from __future__ import annotations

import dataclasses
import json

from llamablock.config import ModelConfig
from llamablock.io.resolve import json_kind

# The corpus's layout (training/data.py): "SPEAKER:\nthe speech\n\n"; every character is in its alphabet.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] | upper }}:\n{{ m['content'] }}\n\n{% endfor %}"
                 "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}")


def tokenizer_json(record: dict) -> dict:
    """A `tokenizers` JSON for a training tokenizer record (training.data's to_dict)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models

    if not isinstance(record, dict):
        raise ValueError(f"the tokenizer record must be a JSON object, got {json_kind(record)}")
    if record.get("kind") == "bpe":
        if not isinstance(record.get("tokenizer"), dict):
            raise ValueError("the tokenizer record (kind 'bpe') lacks its 'tokenizer' object")
        return record["tokenizer"]
    if record.get("kind") != "char":
        raise ValueError(f"unknown tokenizer record (kind {record.get('kind')!r}); expected 'char' or 'bpe'")
    chars = record.get("chars")
    if not isinstance(chars, str) or not chars:
        raise ValueError(f"the tokenizer record's 'chars' must be the string of its characters, got {json_kind(chars)}")
    seen = set()
    for c in chars:  # one id per character: a repeated one would give two ids one spelling and shift the rest
        if c in seen:
            raise ValueError(f"the tokenizer record's 'chars' lists the character {c!r} more than once (each "
                             "character has one id; llamablock never writes a character twice)")
        seen.add(c)
    ahead = next((i for i in range(1, len(chars)) if chars[i] < chars[i - 1]), None)
    if ahead is not None:  # ids are positions in sorted order (training.data.CharTokenizer sorts them again)
        raise ValueError(f"the tokenizer record's 'chars' are not in sorted order ({chars[ahead - 1]!r} before "
                         f"{chars[ahead]!r}; each id is a character's place in sorted order, and llamablock writes "
                         "them sorted)")
    backend = Backend(models.BPE({c: i for i, c in enumerate(record["chars"])}, []))
    backend.decoder = decoders.Fuse()  # the default decoder would join tokens with spaces
    return json.loads(backend.to_str())


def tokenizer_from_record(record: dict):
    """llamablock.io.tokenizer.Tokenizer for a training record: no special tokens, the chat template above."""
    from tokenizers import Tokenizer as Backend

    from llamablock.io.tokenizer import Tokenizer

    spec = tokenizer_json(record)
    try:
        backend = Backend.from_str(json.dumps(spec))
    except Exception as e:  # the tokenizers library raises a bare Exception on a malformed one
        raise ValueError("the tokenizers library cannot read the tokenizer record's tokenizer.json "
                         f"({e})") from None
    return Tokenizer(backend, None, [], chat_template=CHAT_TEMPLATE)


def model_config(d, where: str) -> ModelConfig:
    """ModelConfig.from_dict(d), every refusal a ValueError naming `where` (the file and its field)."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be a JSON object of ModelConfig's fields, got {json_kind(d)}")
    required = [f.name for f in dataclasses.fields(ModelConfig)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in d]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(map(repr, missing))} (edited or truncated?)")
    try:
        return ModelConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None
