"""A family's names and constants are written once, in its record (families.py).

Read from the source with `ast` (docstrings and comments left out): outside families.py no code
compares a value with a family's name or keys a table by one (a branch on the family), no
transformers class or GGUF architecture of a family is spelled out, and the translation and maths
files hold none of the numbers the records set (Gemma 2's caps, the local/global pattern, the
defaults for absent keys). Numbers of at most 2 and the records' own field defaults (10,000, the
RoPE base every family shares) are too common to attribute and are not looked for.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from llamablock.families import FAMILIES, Family

PKG = Path(__file__).resolve().parents[2] / "src" / "llamablock"
# Strings that coincide with a family's name but name something else, with the reason.
ELSEWHERE = {
    ("io/tokenizer.py", "llama"): "llama.cpp's SentencePiece tokenizer model (tokenizer.ggml.model)",
    ("io/tokenizer.py", "qwen2"): "a pre-tokenizer's name (tokenizer.ggml.pre)",
    ("io/export_gguf.py", "llama"): "the one GGUF architecture the exporter writes",
    # The exporter picks the plain family whose bias rule gives the model's biases; left to its
    # owner to read from the records (a leftover, not a second registry).
    ("io/export.py", "llama"): "the transformers family an export of the module's block matches",
    ("io/export.py", "qwen2"): "the transformers family an export with q, k, v biases only matches",
}
# Where the records' numbers must not reappear: the translations and the maths.
TRANSLATION_AND_MATHS = ("config.py", "io/hf_config.py", "io/gguf_families.py", "io/gguf.py", "io/hf_checkpoint.py",
                         "io/tensor_names.py", "model.py", "blocks.py", "attention.py", "norm.py")


def _code_constants(path: Path):
    """(constant node, its parent) for every constant of the file that is not a docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if isinstance(child, ast.Constant) and id(child) not in docs:
                yield child, parent


def family_branches(pkg: Path = PKG) -> list[str]:
    """'file:line name' wherever code outside families.py compares with a family's name, holds one
    in a literal table or tuple, or spells a family's transformers class or GGUF-only name."""
    names = {f.name for f in FAMILIES.values()} - {"llamablock"}
    spelled = ({f.architecture for f in FAMILIES.values() if f.architecture}
               | {f.gguf for f in FAMILIES.values() if f.gguf} | {f.multimodal for f in FAMILIES.values() if f.multimodal})
    spelled -= names
    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if rel == "families.py":
            continue
        for node, parent in _code_constants(path):
            value = node.value
            if not isinstance(value, str) or (rel, value) in ELSEWHERE:
                continue
            branch = value in names and isinstance(parent, (ast.Compare, ast.Dict, ast.Tuple, ast.List, ast.Set))
            if branch or value in spelled:
                found.append(f"{rel}:{node.lineno} {value}")
    return sorted(found)


def record_numbers() -> set[float]:
    """The numbers the records set, apart from the small ones and the fields' own defaults."""
    defaults = {f.default for f in dataclasses.fields(Family) if f.default is not dataclasses.MISSING}
    out = set()
    for fam in FAMILIES.values():
        for f in dataclasses.fields(Family):
            value = getattr(fam, f.name)
            for x in value.values() if isinstance(value, dict) else [value]:
                if isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) > 2 and x not in defaults:
                    out.add(x)
    return out


def repeated_numbers(pkg: Path = PKG) -> list[str]:
    numbers = record_numbers()
    return [f"{rel}:{node.lineno} {node.value}" for rel in TRANSLATION_AND_MATHS
            for node, _ in _code_constants(pkg / rel)
            if isinstance(node.value, (int, float)) and not isinstance(node.value, bool) and node.value in numbers]


def test_no_code_outside_the_registry_branches_on_a_family():
    assert family_branches() == []


def test_the_records_numbers_are_written_nowhere_else():
    assert record_numbers() >= {50.0, 30.0, 6, 128, 256, 4096}  # Gemma 2's caps, Gemma 3's pattern, defaults
    assert repeated_numbers() == []


def test_the_scans_find_what_they_look_for(tmp_path):
    """The scans, run on a copy of the translations with a family written back into them, find it."""
    for rel in ("families.py", "io/hf_config.py", "io/gguf_families.py", *TRANSLATION_AND_MATHS):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((PKG / rel).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "io/hf_config.py").write_text((tmp_path / "io/hf_config.py").read_text() + (
        '\n\ndef _caps(family):\n    return (50.0, 30.0) if family == "gemma2" else None\n'
        '\n\n_ARCH = {"phi3": "Phi3ForCausalLM"}\n'))
    assert family_branches(tmp_path) == sorted([f"io/hf_config.py:{_line(tmp_path, 'gemma2')} gemma2",
                                                f"io/hf_config.py:{_line(tmp_path, 'phi3')} phi3",
                                                f"io/hf_config.py:{_line(tmp_path, 'phi3')} Phi3ForCausalLM"])
    assert sorted(repeated_numbers(tmp_path)) == sorted(f"io/hf_config.py:{_line(tmp_path, '50.0')} {x}"
                                                        for x in (50.0, 30.0))


def _line(root: Path, text: str) -> int:
    return next(i for i, line in enumerate((root / "io/hf_config.py").read_text().splitlines(), 1) if text in line)
