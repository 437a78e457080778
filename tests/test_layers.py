"""The package's layers: every import points down, and no import cycle exists.

The module's own files sit at the package root (the bottom layer); every other concern is a
folder that may import only from the layers beneath it (README, "The layout"). Folders on one
line are siblings: neither imports the other. Imports are read from the source with `ast`, those
inside functions included, so a lazy import cannot hide an upward arrow.
Run alone: `python -m pytest tests/test_layers.py`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "src" / "llamablock"

# Bottom to top. "util" knows nothing of models; "" is the package root (the module's files);
# "api" is the package's __init__ (the public API, whose loaders come from io/); "cli" is the
# entry point. Folders on one line are siblings.
LAYERS: list[tuple[str, ...]] = [
    ("util",),
    ("",),
    ("io",),
    ("api",),
    ("runtime",),
    ("fast", "training"),
    ("diagnostics",),
    ("studies",),
    ("lab", "benchmarks"),
    ("web",),
    ("commands",),
    ("cli",),
    ("__main__",),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for the package and the repository's benchmarks/."""
    found = {}
    for root, prefix in ((PKG, "llamablock"), (REPO / "benchmarks", "benchmarks")):
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def layer_of(module: str) -> str:
    """The layer a dotted module name belongs to."""
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return "benchmarks"
    if len(parts) == 1:
        return "api"
    if parts[1] in RANK and (len(parts) > 2 or parts[1] in ("cli", "__main__")):
        return parts[1]
    return "" if len(parts) == 2 and (PKG / f"{parts[1]}.py").exists() else parts[1]


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The llamablock/benchmarks modules that `module` imports (resolving `from pkg import mod`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + [node.module])
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        out |= {n for n in names if n in known and n != module}
    return out


def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import of a module in a layer that is not beneath a's own."""
    bad = []
    for a, targets in g.items():
        la = layer_of(a)
        for b in targets:
            lb = layer_of(b)
            if lb != la and RANK[lb] >= RANK[la]:
                bad.append(f"{a} ({la or 'root'}) -> {b} ({lb or 'root'})")
    return sorted(bad)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), package inits left out."""
    inits = {m for m in g if _modules()[m].name == "__init__.py"}
    g = {m: {t for t in ts if t not in inits} for m, ts in g.items() if m not in inits}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    unknown = sorted({layer_of(m) for m in _modules()} - set(RANK))
    assert not unknown, f"folders with no place in LAYERS: {unknown}"


def test_no_import_points_up_or_sideways():
    assert upward_imports(graph()) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_package_root_holds_the_module_files_only():
    root = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(root) <= 16, root


@pytest.mark.parametrize("case", ["up", "cycle"])
def test_the_checks_can_fail(case):
    """A root module importing from fast/ is reported, and so is a two-module cycle."""
    g = graph()
    if case == "up":
        g["llamablock.attention"] = g["llamablock.attention"] | {"llamablock.fast.quant"}
        added = set(upward_imports(g)) - set(upward_imports(graph()))
        assert added == {"llamablock.attention (root) -> llamablock.fast.quant (fast)"}
    else:
        g["llamablock.rope"] = g["llamablock.rope"] | {"llamablock.attention"}
        assert ["llamablock.attention", "llamablock.rope"] in cycles(g)
