"""No experiment writes a sentence: a claim's details and indicative reason are said() entries, each a
template of details_text.DETAILS filled with values (lab/details_text.py).

Statically, over every experiment module (so the full-lab-only paths are held too, which no test
runs): no string or f-string is handed to a verdict or set as a reason, and every said() names a
template of the table with the template's own fields. On runs: the exact experiments' claims,
rendered into a report, pass test_report_text's check line by line."""

import ast
import string
from pathlib import Path

import pytest

from llamablock.lab import details_text, exp_blocks, exp_ffn, exp_scaling
from llamablock.lab.details_text import DETAILS, fields, render, said
from llamablock.lab.report import document, render_report

LAB = Path(details_text.__file__).parent
VERDICTS = {"judge": 1, "define": 0, "unmeasurable": 0, "not_run": 0, "judge_ratio": 4}  # call -> leading args skipped


def _text(node) -> bool:
    """A string, an f-string, or a sum or join made of one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) or isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _text(node.left) or _text(node.right)
    if isinstance(node, ast.IfExp):
        return _text(node.body) or _text(node.orelse)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"


def _names(node) -> list[str]:
    """The template names a said() call's first argument can take: a literal, or either branch of a
    conditional; anything else cannot be checked here, and is refused."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _names(node.body) + _names(node.orelse)
    return ["<not a literal>"]


def source_problems(path: Path) -> tuple[list[str], set[str]]:
    """(what in `path` writes free text or names no template rightly, the templates its said() calls name)."""
    bad, named = [], set()
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            call = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if call in VERDICTS:
                bad += [f"{where}: {call}() is given text" for a in node.args[VERDICTS[call]:] if _text(a)]
            bad += [f"{where}: details= is given text" for k in node.keywords if k.arg == "details" and _text(k.value)]
            if call == "said":
                keys = {k.arg for k in node.keywords}
                for name in _names(node.args[0]):
                    if name not in DETAILS:
                        bad.append(f"{where}: said({name!r}) names no template of DETAILS")
                        continue
                    takes, open_ = fields(DETAILS[name]), None in keys  # **values: only a subset is known
                    if keys - {None} - takes or not open_ and keys != takes:
                        bad.append(f"{where}: said({name!r}) given {sorted(keys - {None})}, takes {sorted(takes)}")
                    named.add(name)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr in ("indicative", "details")
                                                for t in node.targets) and _text(node.value):
            bad.append(f"{where}: a reason set to text")
    return bad, named


def _lab_sources() -> list[Path]:
    return sorted(p for p in LAB.glob("*.py") if not p.name.startswith("details_"))


def test_no_experiment_writes_free_text():
    bad, named = [], set()
    for path in _lab_sources():
        found, names = source_problems(path)
        bad += found
        named |= names
    assert bad == []
    assert set(DETAILS) - named == set()  # and no template is left that nothing says


def test_the_source_check_sees_free_text(tmp_path):
    """An experiment with each kind of free text in it: the check names every one."""
    free = tmp_path / "exp_free.py"
    free.write_text('''
def run(c, ok, r, steps):
    c.judge(ok, "trained to convergence")
    c.unmeasurable(f"only {steps} steps")
    c.judge(ok, said("15.3.speed-fused differs", widths=[1]) , "plus a sentence")
    judge_ratio(c, r, 1.0, 2.0, "on this CPU")
    c.indicative = "quick run"
    c.judge(ok, said("a sentence of my own"))
    c.judge(ok, said("15.3.speed-fused differs", widths=[1], note="x"))
    c.judge(ok, said("15.3.speed-fused differs"))
''')
    bad, _ = source_problems(free)
    assert len(bad) == 8, bad


def test_templates_are_fields_and_sentences():
    """Every template parses, and the four specs of details_text format as its docstring says."""
    for name, template in DETAILS.items():
        assert list(string.Formatter().parse(template)), name
    assert render([said("15.2.ntk-wording fast", n_hurt=3, n_fast=10)]).startswith("The caption's")
    fill = details_text._FILL.format_field
    assert fill([3, 4, 5, 9], "ranges") == "3-5, 9" and fill([], "ranges") == "none"
    assert fill([2.5, 0.01, 3], "loss") == "2.5000 ± 0.0100 (sd, 3 seeds)" and fill([2.5, 0, 1], "loss") == "2.5000 (one seed)"
    assert fill([0.1, None, None], "ci") == "+0.1000 (no interval)" and fill(True, "?a|b") == "a" and fill(1, "seeds") == "one seed"
    assert fill({"0": 1e-7}, ".1e") == "0: 1.0e-07"


@pytest.mark.parametrize("module", [exp_scaling, exp_ffn, exp_blocks], ids=lambda m: m.__name__.split(".")[-1])
def test_exact_experiments_report_only_templates_filled_from_results(module):
    from test_report_text import ENV, check_report

    claims = module.run(True, None)
    assert all(c.details for c in claims if c.id != "ex.four-changes" or c.details)
    doc = document(claims, ENV, quick=True)
    assert check_report(render_report(doc), doc) == []
