"""The model a command runs, read once: `open_source(--model)` -> ModelSource.

A command turns its `--model` into a source first, and passes the source down: deciding how to
run it (fast/plan.py) and loading its weights (io/loading.py `load_decoder`, fast/kernels/native.py) take
the source, so nothing below resolves the name again, asks the Hub again or parses a header twice
(tests/faces/test_compile_cli.py counts it: `ONE_EACH`). What a source holds, all but the weights:
    path        the file or folder the name means (io/resolve.py: a path, a training run's latest
                checkpoint, a Hub snapshot, a model shipped in a Python package)
    kind        "gguf", "transformers" (config.json + safetensors) or "llamablock" (a checkpoint
                folder, or an export of one: io/llamablock_dir.py)
    cfg         its ModelConfig
    tokenizer   its Tokenizer (None when opened with tokenizer=False: `llamablock compile`)
    stored      the types its weights are stored in: a GGUF's type per matrix, else
                {"*": config.json's torch_dtype}; fast/formats.py maps them to formats
    generation  generation_config.json's sampling keys, checked ({} for a GGUF: it keeps none)
    index       a GGUF's tensors (io/gguf_read.py TensorIndex) without the header's parse,
                which is dropped here, before any weight is read (its vocabulary's objects
                are near a small model's weights in size: `llamablock bench memory`)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from llamablock.config import ModelConfig
from llamablock.io import resolve
from llamablock.io.llamablock_dir import is_llamablock_dir, read_llamablock_dir


@dataclass
class ModelSource:
    given: str | None  # what --model said (None: the default model)
    path: Path
    kind: str
    cfg: ModelConfig
    stored: dict[str, str]
    generation: dict = field(default_factory=dict)
    tokenizer: object | None = None
    index: object | None = None  # GGUF only
    where: str = ""  # the file the config was read from, for errors about the weights

    @property
    def name(self) -> str:
        """What a server calls the model: an embedded model's name, else the file's or folder's name."""
        given = self.given or resolve.DEFAULT_MODEL
        return given if given in resolve.EMBEDDED else Path(given).name


def open_source(model: str | Path | None, tokenizer: bool = True) -> ModelSource:
    """`model` (a path or name, as --model takes it; None: the default) resolved and read once.
    `tokenizer=False` skips building the tokenizer (a compile needs none)."""
    given = None if model is None else str(model)
    path = resolve.resolve_model(model)
    if is_llamablock_dir(path):
        cfg, tok, where = read_llamablock_dir(path, tokenizer)
        return ModelSource(given, path, "llamablock", cfg, {"*": _torch_dtype(path)}, generation_config(path), tok,
                           where=where)
    if path.is_dir():
        from llamablock.io.hf_checkpoint import read_hf_config
        from llamablock.io.tokenizer import tokenizer_from_dir

        cfg, hf = read_hf_config(path)
        label = hf.get("torch_dtype") or hf.get("dtype") or "float32"
        return ModelSource(given, path, "transformers", cfg, {"*": label}, generation_config(path),
                           tokenizer_from_dir(path) if tokenizer else None, where=str(path / "config.json"))
    from llamablock.io.gguf import config_from_gguf, open_gguf, tensor_index
    from llamablock.io.tokenizer import tokenizer_from_gguf

    reader = open_gguf(path)
    cfg = config_from_gguf(reader)
    tok = tokenizer_from_gguf(reader) if tokenizer else None
    stored = {t.name: t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    index = tensor_index(reader)  # drops the vocabulary's parse; the rest of the reader goes here
    del reader
    return ModelSource(given, path, "gguf", cfg, stored, {}, tok, index, where=str(path))


def _torch_dtype(path: Path) -> str:
    """A llamablock folder's stored dtype: its config.json's torch_dtype where an export wrote one."""
    conf = path / "config.json"
    d = resolve.read_json(conf) if conf.is_file() else {}
    return d.get("torch_dtype") or d.get("dtype") or "float32"


GENERATION_CHECKS = {
    "temperature": ("a finite number >= 0", lambda v: _number(v) and v >= 0),
    "top_p": ("a number in (0, 1]", lambda v: _number(v) and 0 < v <= 1),
    "repetition_penalty": ("a finite number > 0", lambda v: _number(v) and v > 0),
    "top_k": ("a whole number >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def generation_config(path: Path) -> dict:
    """A directory's generation_config.json (sampling defaults, transformers' keys), or {}. The keys
    sampling reads are checked here, so that a bad one is refused naming the file and the key."""
    f = path / "generation_config.json"
    if not f.is_file():
        return {}
    d = resolve.read_json(f)
    if d.get("do_sample") is not None and not isinstance(d["do_sample"], bool):
        raise ValueError(f"{f}: do_sample must be true or false, got {d['do_sample']!r}")
    used = ("repetition_penalty",) + (("temperature", "top_k", "top_p") if d.get("do_sample") else ())
    for key in used:
        want, ok = GENERATION_CHECKS[key]
        if d.get(key) is not None and not ok(d[key]):
            raise ValueError(f"{f}: {key} must be {want}, got {d[key]!r}")
    return d
