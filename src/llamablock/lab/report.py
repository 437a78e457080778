"""report.md: a short paper, one part per section of the module, each claim with the module's
figure, the measured one, the verdict and how it was measured, then what the section's results
mean. It is written from the results document alone (results.json, `document`), each line one
template of report_text.TEMPLATES filled from it, a claim's details and indicative reason each the
templates of details_text.DETAILS its entries name, so the report says nothing results.json does
not hold. Numbers are printed to the precision their comparison needs (`fmt`), structured values as
small tables, never as Python reprs."""

from __future__ import annotations

from collections import Counter

from llamablock.lab.details_text import render
from llamablock.lab.record import DEFINITION, DIFFERS, NOT_MEASURABLE, NOT_RUN, REPRODUCED, Claim
from llamablock.lab.report_text import READINGS, SECTIONS, TEMPLATES


def say(name: str, **values) -> str:
    """One line of the report: template `name` filled with `values`."""
    return TEMPLATES[name].format(**values)


def fmt(v) -> str:
    """A value to the precision its comparison needs: integers with thousands separators, floats to 4
    decimals (trailing zeros dropped) or 3 significant digits in e-notation when tiny or huge."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) < 1e-3 or abs(v) >= 1e7:
            return f"{v:.3g}"
        return f"{v:.4f}".rstrip("0").rstrip(".")
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v)
    if isinstance(v, dict):
        return "; ".join(f"{k}: {fmt(x)}" for k, x in v.items())
    return str(v)


def _cell(v) -> str:
    return fmt(v).replace("|", "\\|").replace("\n", " ")


def _ids(claims: list[dict]) -> str:
    return ", ".join(f"`{c['id']}`" for c in claims)


def _count(claims: list[dict]) -> dict:
    n = Counter(c["verdict"] for c in claims)
    return {"n": len(claims), "reproduced": n[REPRODUCED], "differs": n[DIFFERS], "unmeasurable": n[NOT_MEASURABLE]}


def document(claims: list[Claim], env: dict, quick: bool, timings: dict[str, float] | None = None,
             declared: dict[str, list[str]] | None = None) -> dict:
    """The results document (results.json): everything the report is written from. `declared`:
    section -> the claim ids the lab's experiments declare for it (runner.declared)."""
    return {"environment": env, "quick": quick, "seconds": timings or {}, "declared": declared or {},
            "claims": [c.to_dict() if isinstance(c, Claim) else c for c in claims]}


def headline(claims: list[dict]) -> list[str]:
    """The counts, the module's claims apart from those beyond it; not-run and definitions apart too."""
    claims = [c.to_dict() if isinstance(c, Claim) else c for c in claims]
    beyond = [c for c in claims if c["section"] == "beyond"]
    module = [c for c in claims if c["section"] != "beyond"]
    lines = [say("counts", **_count(module))]
    if not_run := [c for c in module if c["verdict"] == NOT_RUN]:
        lines.append(say("not-run", n=len(not_run), ids=_ids(not_run)))
    if n := sum(c["verdict"] == DEFINITION for c in module):
        lines.append(say("definitions", n=n))
    if n := sum(1 for c in module if c["indicative"]):
        lines.append(say("indicative", n=n))
    if beyond:
        lines.append(say("beyond", **_count(beyond)))
    return lines


def _decimals(column: list) -> int | None:
    """The decimals a column of floats needs: the most that `fmt` gives any of them, so 2.79 prints as
    2.790 beside 2.949 and a column reads at one precision. None when a value is in e-notation."""
    places = 0
    for v in column:
        if isinstance(v, float) and v == v:  # NaN (v != v) prints blank
            text = fmt(v)
            if "e" in text:
                return None
            places = max(places, len(text.partition(".")[2]))
    return places


def _table(rows: list[dict]) -> list[str]:
    """A structured value as a markdown table; floats aligned to one precision per column, a missing or NaN
    entry blank (not measured there)."""
    keys = list(rows[0])
    places = {k: _decimals([r.get(k) for r in rows]) for k in keys}

    def cell(k, v):
        if isinstance(v, float) and v != v:
            return ""
        if isinstance(v, float) and places[k] is not None:
            return f"{v:.{places[k]}f}"
        return _cell("" if v is None else v)

    return (["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            + ["| " + " | ".join(cell(k, r.get(k, "")) for k in keys) + " |" for r in rows])


def meaning(section: str, part: list[dict], missing: list[str] = ()) -> list[str]:
    """What this section's results mean, written from them: the counts, the reading of each key claim for
    the outcome it had (READINGS), the claims that differ with their figures, those not measurable, not
    run or definitions, what rests on the quick run only, and which declared claims this run did not
    record. A sentence that another outcome would make false is never written."""
    by = {v: [c for c in part if c["verdict"] == v] for v in (REPRODUCED, DIFFERS, NOT_MEASURABLE, NOT_RUN, DEFINITION)}
    text = [say("meaning", n=len(part), reproduced=len(by[REPRODUCED]), differs=len(by[DIFFERS]),
                unmeasurable=len(by[NOT_MEASURABLE]), not_run=len(by[NOT_RUN]), definitions=len(by[DEFINITION]))]
    if by[REPRODUCED] and not by[DIFFERS]:
        text.append(say("all-judged-reproduced"))
    for c in by[REPRODUCED] + by[DIFFERS]:
        if c["id"] in READINGS:
            text.append(say(f"reading {c['id']} {'reproduced' if c['verdict'] == REPRODUCED else 'differs'}",
                            measured=_cell(c["measured"])))
    text += [say("differs", id=c["id"], source_value=_cell(c["source_value"]), measured=_cell(c["measured"]))
             for c in by[DIFFERS]]
    for verdict, name in ((NOT_MEASURABLE, "unmeasurable"), (NOT_RUN, "not-run-here"), (DEFINITION, "defined")):
        if by[verdict]:
            text.append(say(name, ids=_ids(by[verdict])))
    reasons: dict[str, list[dict]] = {}
    for c in part:
        if c["indicative"]:
            reasons.setdefault(_cell(render(c["indicative"])), []).append(c)
    text += [say("indicative-group", indicative=reason, ids=_ids(group)) for reason, group in reasons.items()]
    if missing:
        text.append(say("missing", ids=", ".join(f"`{i}`" for i in missing)))
    return text


def _claim_lines(c: dict) -> list[str]:
    fields = {k: _cell(c[k]) for k in ("id", "claim", "source_value", "measured", "unit", "verdict")}
    fields["verdict"] = f"**{c['verdict']}**" + (" (indicative)" if c["indicative"] else "")
    return [say("row" if c["unit"] else "row-no-unit", **fields)]


def _detail_lines(c: dict) -> list[str]:
    details = render(c["details"])
    details += "." if details and not details.endswith((".", "!", "?")) else ""
    values = {"id": c["id"], "tolerance": _cell(c["tolerance"]), "details": _cell(details)}
    if c["indicative"]:
        lines = [say("detail-indicative", indicative=_cell(render(c["indicative"])), **values)]
    else:
        lines = [say("detail" if c["tolerance"] else "detail-no-tolerance", **values)]
    if c["table"]:
        lines += [""] + [say("subtable", cells=row[1:-1]) for row in _table(c["table"])] + [""]
    for p in c.get("plots", []):
        lines += ["", say("plot", id=c["id"], plot=p)]
    return lines


def render_report(doc: dict) -> str:
    """The report, from the results document alone (`document`, or results.json read back)."""
    env, claims = doc["environment"], doc["claims"]
    machine = " ".join(x for x in (env["machine"], env["processor"]) if x)
    lines = [say("title"), "", say("run", flag=" --quick" if doc["quick"] else "", date=env["date"],
                                    python=env["python"], torch=env["torch"], machine=machine, threads=env["threads"]),
             "", *headline(claims), "", say("legend"), ""]
    if doc["quick"]:
        lines += [say("quick"), ""]
    for section, (title, _) in SECTIONS.items():
        part = [c for c in claims if c["section"] == section]
        if not part:
            continue
        lines += [say("section", heading=f"{section} {title}" if section.startswith("15.") else title), "",
                  say(f"intro {section}"), "", say("table-head"), say("table-rule")]
        lines += [line for c in part for line in _claim_lines(c)] + [""]
        lines += [line for c in part for line in _detail_lines(c)]
        recorded = {c["id"] for c in part}
        missing = [i for i in doc.get("declared", {}).get(section, []) if i not in recorded]
        lines += ["", *meaning(section, part, missing), ""]
    if doc["seconds"]:
        lines += [say("run-head"), "", say("run-table-head"), say("run-table-rule")]
        lines += [say("run-row", title=title, seconds=f"{sec:.1f}") for title, sec in doc["seconds"].items()] + [""]
    return "\n".join(lines)
