"""The package's layers: every import points down, and no import cycle exists.

The module's own files sit at the package root (the bottom layer); every other concern is a
folder that may import only from the layers beneath it (docs/guide.md, "The library"). Folders on one
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
# fast/ is three rooms: its table of formats, the kernels and their layers, and the compiled engines
# above them, with the plan (fast/plan.py) on top; "api" is the package's __init__ (the public
# API: `llamablock.load` runs the plan); "cli" is the entry point. Folders on one line are siblings.
LAYERS: list[tuple[str, ...]] = [
    ("util",),
    ("",),
    ("io",),
    ("runtime",),
    ("fast.formats",),
    ("fast.kernels", "training"),
    ("fast.compiled",),
    ("fast",),
    ("api",),
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
    if parts[1] == "fast" and len(parts) > 2 and f"fast.{parts[2]}" in RANK:  # fast.kernels.quant -> fast.kernels
        return f"fast.{parts[2]}"
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


# The module's own files, in its order (STYLE.md, "A house that shows the module"), the families' records
# (families.py: what each descendant of 15.6 sets) and the entry point.
ROOT = {"config", "families", "presets", "rope", "rope_scaling", "alibi", "positions", "norm", "ffn", "attention", "kv_cache",
        "blocks", "model", "cli"}
# The longest chain of imports, package inits left out: a bound on how deep reading one module goes.
CHAIN_BOUND = 15


def root_modules() -> set[str]:
    return {p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__")}


def longest_chain(g: dict[str, set[str]]) -> list[str]:
    """The longest path of imports (the graph has no cycle: test_no_import_cycle)."""
    inits = {m for m in g if _modules()[m].name == "__init__.py"}
    g = {m: {t for t in ts if t not in inits} for m, ts in g.items() if m not in inits}
    memo: dict[str, list[str]] = {}

    def from_(v: str) -> list[str]:
        if v not in memo:
            memo[v] = [v] + max((from_(w) for w in g[v]), key=len, default=[])
        return memo[v]

    return max((from_(v) for v in g), key=len)


def test_package_root_holds_the_module_files_only():
    assert root_modules() == ROOT


def test_the_longest_import_chain_is_bounded():
    chain = longest_chain(graph())
    assert len(chain) <= CHAIN_BOUND, " -> ".join(chain)


@pytest.mark.parametrize("case", ["up", "kernels-up", "cycle", "chain", "root"])
def test_the_checks_can_fail(case, tmp_path, monkeypatch):
    """A root module importing from fast/ is reported, a kernel module importing a compiled engine,
    a two-module cycle, a chain made longer than the bound, and a file at the root that is not one
    of the module's."""
    g = graph()
    if case == "chain":
        links = [f"llamablock.io.link{i}" for i in range(CHAIN_BOUND)]
        g.update({a: {b} for a, b in zip(links, links[1:] + ["llamablock.config"], strict=True)})
        monkeypatch.setattr(__import__(__name__), "_modules",
                            lambda real=_modules: {**real(), **{m: Path(f"{m}.py") for m in links}})
        assert len(longest_chain(g)) > CHAIN_BOUND
    elif case == "root":
        monkeypatch.setattr(__import__(__name__), "PKG", tmp_path)
        for name in [*ROOT, "loader_helpers"]:
            (tmp_path / f"{name}.py").write_text("")
        assert root_modules() - ROOT == {"loader_helpers"}
    elif case == "kernels-up":
        g["llamablock.fast.kernels.quant"] = g["llamablock.fast.kernels.quant"] | {"llamablock.fast.compiled.builds"}
        added = set(upward_imports(g)) - set(upward_imports(graph()))
        assert added == {"llamablock.fast.kernels.quant (fast.kernels) -> llamablock.fast.compiled.builds (fast.compiled)"}
    elif case == "up":
        g["llamablock.attention"] = g["llamablock.attention"] | {"llamablock.fast.kernels.quant"}
        added = set(upward_imports(g)) - set(upward_imports(graph()))
        assert added == {"llamablock.attention (root) -> llamablock.fast.kernels.quant (fast.kernels)"}
    else:
        g["llamablock.rope"] = g["llamablock.rope"] | {"llamablock.attention"}
        assert ["llamablock.attention", "llamablock.rope"] in cycles(g)
