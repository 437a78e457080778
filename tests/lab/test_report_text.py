"""Every line of report.md is one template of report_text.TEMPLATES filled from results.json: the
report re-renders byte for byte from the document, each line matches a template in full, each
field named for a claim's field holds that claim's value, and a claim's details and indicative
reason are the templates of details_text.DETAILS its entries name, filled with values that are not
text, so no sentence can carry a figure (or a word) that results.json does not. `check_report` is
also run on a real quick lab's output by the end-to-end test in test_lab.py, and on the exact
experiments' own claims in test_details_text.py."""

import json
import re

import pytest

from llamablock.lab import report
from llamablock.lab.details_text import problems, render, said
from llamablock.lab.record import DIFFERS, NOT_MEASURABLE, NOT_RUN, REPRODUCED, Claim
from llamablock.lab.report import _cell, document, render_report
from llamablock.lab.report_text import READINGS, TEMPLATES

CLAIM_FIELDS = ("claim", "source_value", "measured", "unit", "tolerance")


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
        if "indicative" in got:
            fixed["indicative"] = re.escape(_cell(render(c["indicative"])))
        if "details" in got:
            fixed["details"] = f"{re.escape(_cell(render(c['details'])))}\\.?"
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


def entry_problems(doc: dict) -> list[str]:
    """Each claim's details and indicative entries that are not a DETAILS template filled with values."""
    bad = []
    for c in doc["claims"]:
        for key in ("details", "indicative"):
            if not isinstance(c[key], list):
                bad.append(f"{c['id']} {key}: not a list of said() entries: {str(c[key])[:80]!r}")
                continue
            bad += [f"{c['id']} {key}: {p}" for entry in c[key] for p in problems(entry)]
    return bad


def check_report(text: str, doc: dict) -> list[str]:
    """The lines of `text` that no template filled from `doc` produces (empty: the report is the document's);
    first, the claims' entries that are not templates filled with values (then nothing is rendered)."""
    if bad := entry_problems(doc):
        return bad
    claims = {c["id"]: c for c in doc["claims"]}
    known = set(claims) | {i for ids in doc["declared"].values() for i in ids}
    bad = [] if render_report(json.loads(json.dumps(doc))) == text else ["<not the rendering of results.json>"]
    for line in text.splitlines():
        if line and not any(_matches(n, line, claims, known) for n in PATTERNS):
            bad.append(line)
    return bad


# how each claim was measured: two sentences of DETAILS, one with a list and a name among its values
HOW = (said("15.3.speed-fused differs", widths=[1024, 4096]),
       said("compare", name="2017 + GQA", loss=[3.1, 0.01, 3], base="2017", base_loss=[3.2, 0.02, 3], params=10_000,
            base_params=10_001, noise=0.04))
ENV = {"date": "d", "python": "3", "torch": "t", "machine": "m", "processor": "", "threads": 1}


def _doc(outcome: str) -> dict:
    """Every claim READINGS knows, all with `outcome`, plus one of each other verdict, a table and a plot."""
    claims = [Claim(i, i.split(".")[0] + "." + i.split(".")[1], "a claim", 4.0, measured=[0.825, 3.3], unit="x",
                    tolerance="within 1").judge(outcome == REPRODUCED, *HOW) for i in READINGS]
    claims[0].table = [{"width": 1024, "ratio": 0.825}]
    claims[0].plots = ["a.png"]
    claims[1].indicative = [said("15.5.decode-speed quick", rounds=8, full_rounds=30)]
    claims += [Claim("15.2.real-x", "15.2", "real", "drops", tolerance="above 0").not_run(said("real not run")),
               Claim("15.3.y", "15.3", "y", None).unmeasurable(said("ratio unsettled")),
               Claim("ex.z", "exercises", "z", 1).define(), Claim("beyond.q", "beyond", "q", None).judge(True)]
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
    assert check_report(text.replace("At width 1024, 4096", "Trained to convergence, at width 1024", 1), doc) != []
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
    assert detail == f"- `15.2.real-x` (above 0): {render([said('real not run')])}"


def _with_details(details) -> dict:
    doc = _doc(REPRODUCED)
    doc["claims"][0]["details"] = details
    return doc


def test_the_check_fails_on_details_that_are_not_templates_filled_with_values():
    """What an experiment that writes free text leaves in results.json: a sentence for details, a
    sentence smuggled in as a value, a template the table lacks, a value for no field of it."""
    how = said("15.3.speed-fused differs", widths=[1024])
    free = [
        "trained to convergence, so the gap is real",  # a sentence, not entries
        [how, "Removing the mean raised the loss."],  # one free sentence among entries
        [{"template": "15.3.speed-fused differs", "values": {"widths": "all of them, as expected. Really"}}],
        [{"template": "15.3.speed-fused differs", "values": {"widths": "every width the model was run at"}}],
        [{"template": "a sentence of my own", "values": {}}],
        [{"template": "15.3.speed-fused differs", "values": {"widths": [1024], "note": 1}}],
    ]
    for details in free:
        doc = _with_details(details)
        assert entry_problems(doc) and check_report("", doc), details
    assert entry_problems(_with_details([how])) == []
    # the same text cannot be recorded in the first place: said() and Claim refuse it
    with pytest.raises(ValueError, match="holds text"):
        said("15.3.speed-fused differs", widths="every width the model was run at")
    with pytest.raises(ValueError, match="takes"):
        said("15.3.speed-fused differs", widths=[1024], note="x")
    with pytest.raises(TypeError, match="not text"):
        Claim("15.3.y", "15.3", "y", None).judge(True, "trained to convergence")
