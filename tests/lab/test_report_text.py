"""Every line of report.md is one template of report_text.TEMPLATES filled from results.json: the
report re-renders byte for byte from the document, each line matches a template in full, and each
field named for a claim's field holds that claim's value, so no sentence can carry a figure (or a
word) that results.json does not. `check_report` is also run on a real quick lab's output by the
end-to-end test in test_lab.py."""

import json
import re

import pytest

from llamablock.lab import report
from llamablock.lab.record import DIFFERS, NOT_MEASURABLE, NOT_RUN, REPRODUCED, Claim
from llamablock.lab.report import _cell, document, render_report
from llamablock.lab.report_text import READINGS, TEMPLATES

CLAIM_FIELDS = ("claim", "source_value", "measured", "unit", "tolerance", "indicative")


def _regex(template: str, fixed: dict[str, str] | None = None) -> re.Pattern:
    """The template as a regex: a field in `fixed` must be that text exactly, any other is free (.*?);
    an {id} never holds a backtick, so it is read first and the claim's own fields fixed from it."""
    fixed = fixed or {}
    parts = re.split(r"(\{[a-z_]+\})", template)

    def field(name):
        if name in fixed:
            return f"(?P<{name}>{fixed[name]})"
        return f"(?P<{name}>[^`]*)" if name == "id" else f"(?P<{name}>.*?)"

    return re.compile("".join(field(p[1:-1]) if p.startswith("{") else re.escape(p) for p in parts))


PATTERNS = {name: _regex(t) for name, t in TEMPLATES.items()}


def _matches(name: str, line: str, claims: dict, known_ids: set) -> bool:
    """`line` is template `name` filled from the document: the claim it names supplies its own fields."""
    m = PATTERNS[name].fullmatch(line)
    if not m:
        return False
    got = m.groupdict()
    if name.startswith("reading "):
        _, cid, outcome = name.split(" ")
        c = claims.get(cid)
        return c is not None and c["verdict"] == outcome and got.get("measured", _cell(c["measured"])) == _cell(
            c["measured"])
    if "id" in got:
        c = claims.get(got["id"])
        if c is None:
            return False
        fixed = {f: re.escape(_cell(c[f])) for f in CLAIM_FIELDS if f in got}
        if "details" in got:
            fixed["details"] = f"{re.escape(_cell(c['details']))}\\.?"
        if "plot" in got:
            fixed["plot"] = "|".join(re.escape(p) for p in c["plots"]) or "(?!)"
        m = _regex(TEMPLATES[name], fixed | {"id": re.escape(c["id"])}).fullmatch(line)
        if not m:
            return False
        got = m.groupdict()
    if "ids" in got and not set(re.findall(r"`([^`]+)`", got["ids"])) <= known_ids:
        return False
    counts = ("n", "reproduced", "differs", "unmeasurable", "not_run", "definitions")
    return all(got[k].isdigit() for k in counts if k in got)


def check_report(text: str, doc: dict) -> list[str]:
    """The lines of `text` that no template filled from `doc` produces (empty: the report is the document's)."""
    claims = {c["id"]: c for c in doc["claims"]}
    known = set(claims) | {i for ids in doc["declared"].values() for i in ids}
    bad = [] if render_report(json.loads(json.dumps(doc))) == text else ["<not the rendering of results.json>"]
    for line in text.splitlines():
        if line and not any(_matches(n, line, claims, known) for n in PATTERNS):
            bad.append(line)
    return bad


ENV = {"date": "d", "python": "3", "torch": "t", "machine": "m", "processor": "", "threads": 1}


def _doc(outcome: str) -> dict:
    """Every claim READINGS knows, all with `outcome`, plus one of each other verdict, a table and a plot."""
    claims = [Claim(i, i.split(".")[0] + "." + i.split(".")[1], "a claim", 4.0, measured=[0.825, 3.3], unit="x",
                    tolerance="within 1").judge(outcome == REPRODUCED, "how it was measured") for i in READINGS]
    claims[0].table = [{"width": 1024, "ratio": 0.825}]
    claims[0].plots = ["a.png"]
    claims[1].indicative = "quick run"
    claims += [Claim("15.2.real-x", "15.2", "real", "drops", tolerance="above 0").not_run("full lab only"),
               Claim("15.3.y", "15.3", "y", None).unmeasurable("spread"), Claim("ex.z", "exercises", "z", 1).define(),
               Claim("beyond.q", "beyond", "q", None).judge(True)]
    return document(claims, ENV, quick=True, timings={"one": 1.25},
                    declared={"15.5": ["15.5.never-run"], "15.2": ["15.2.real-x"]})


@pytest.mark.parametrize("outcome", [REPRODUCED, DIFFERS])
def test_every_line_of_the_report_is_a_template_filled_from_results_json(outcome):
    doc = _doc(outcome)
    text = render_report(doc)
    assert check_report(text, doc) == []
    assert "Not run (full lab only): `15.2.real-x`" in text and "Not measurable here: `15.3.y`" in text
    assert f"reading 15.3.speed-fused {outcome}" in {n for n, p in PATTERNS.items() if any(
        p.fullmatch(line) for line in text.splitlines())}


def test_the_check_fails_on_free_text_or_a_figure_not_from_the_run(monkeypatch):
    doc = _doc(REPRODUCED)
    text = render_report(doc)
    # a sentence written outside the table of templates
    assert check_report(text.replace("## Run", "## Run\n\nRMSNorm is about 10% faster."), doc) != []
    # a reading filled with a figure that is not the claim's measured value
    assert check_report(text.replace("takes 0.825, 3.3 of", "takes 0.85 of"), doc) != []
    # a details line that is not the claim's details
    assert check_report(text.replace("how it was measured", "trained to convergence", 1), doc) != []
    # a report written from something results.json does not hold
    monkeypatch.setitem(TEMPLATES, "title", "# The LLaMA Block, measured")
    monkeypatch.setattr(report, "say", lambda name, **v: TEMPLATES[name].format(**v).replace("0.825", "0.82"))
    assert check_report(render_report(doc), doc) != []


def test_not_run_is_counted_apart_from_not_measurable():
    doc = _doc(REPRODUCED)
    lines = report.headline(doc["claims"])
    n_unmeasurable = sum(c["verdict"] == NOT_MEASURABLE for c in doc["claims"] if c["section"] != "beyond")
    assert f"not measurable here {n_unmeasurable}." in lines[0]
    assert lines[1] == "Not run (full lab only), counted apart from not measurable: 1 (`15.2.real-x`)."
    assert NOT_RUN in {c["verdict"] for c in doc["claims"]}
    detail = next(line for line in render_report(doc).splitlines() if line.startswith("- `15.2.real-x`"))
    assert detail == "- `15.2.real-x` (above 0): full lab only."
