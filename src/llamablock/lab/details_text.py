"""What a claim's details may say: every sentence a template of DETAILS, filled from the run's values.

An experiment never writes a sentence: it records `said(name, **values)`, a template's name and the
values that fill it, in the claim's `details` (and `indicative`), and results.json keeps exactly
that. report.py writes the text (`render`) from the file, so each sentence of the report is a
template of this table or of report_text.TEMPLATES, filled from results.json. A value is a
number, a truth value, a list or mapping of those, or a *name* (a variant, a method, a model
file: at most four words and no sentence in it, `problems`); only the fields in VERBATIM quote
text the run read or raised (an exception's message, the tracer's input). tests/lab/test_details_text.py
holds every experiment to this, statically and on runs.

Fields use str.format's specs, applied to each item of a list or mapping, plus four of this file:
    {x:?yes text|no text}   one of two texts, by the truth of x
    {x:ranges}              a list of pair indices as '3-5, 9' ('none' when empty)
    {x:loss}                [mean, sd, seeds] as '2.5123 ± 0.0100 (sd, 3 seeds)' or '2.5123 (one seed)'
    {x:ci}                  [mean, low, high] as '+0.0123 [+0.0010, +0.0200]' ('(no interval)' without one)
    {x:seeds}               a count of seeds as 'one seed' or '3 seeds'
"""

from __future__ import annotations

import re
import string

from llamablock.lab.details_exact import EXACT
from llamablock.lab.details_measured import MEASURED

DETAILS: dict[str, str] = {**EXACT, **MEASURED}
VERBATIM = ("error", "text")  # fields quoting what the run read or raised, never the lab's own words
WORD = re.compile(r"[A-Za-z][A-Za-z'_-]*")
SENTENCE = re.compile(r"[.;!?](\s|$)|\n")
MAX_WORDS = 4


def ranges(pairs: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out, start = [], None
    for i, p in enumerate(pairs):
        if start is None:
            start = p
        if i + 1 == len(pairs) or pairs[i + 1] != p + 1:
            out.append(f"{start}-{p}" if p != start else f"{p}")
            start = None
    return ", ".join(out)


class _Filler(string.Formatter):
    def format_field(self, value, spec: str) -> str:
        if spec.startswith("?"):
            yes, _, no = spec[1:].partition("|")
            return yes if value else no
        if spec == "ranges":
            return ranges(list(value)) or "none"
        if spec == "loss":
            mean, sd, seeds = value
            return f"{mean:.4f} ± {sd:.4f} (sd, {seeds} seeds)" if seeds > 1 else f"{mean:.4f} (one seed)"
        if spec == "ci":
            mean, low, high = value
            return f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]" if low is not None else f"{mean:+.4f} (no interval)"
        if spec == "seeds":
            return "one seed" if value == 1 else f"{value} seeds"
        if isinstance(value, dict):
            return ", ".join(f"{k}: {self.format_field(v, spec)}" for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return ", ".join(self.format_field(v, spec) for v in value)
        return format(value, spec)


_FILL = _Filler()


def fields(template: str) -> set[str]:
    """The names a template's fields take."""
    return {name for _, name, _, _ in _FILL.parse(template) if name is not None}


def said(name: str, /, **values) -> dict:
    """One sentence of a claim's details: template `name` of DETAILS and the values that fill it. Raises
    ValueError for an unknown template, values that are not its fields, or a value that is text."""
    entry = {"template": name, "values": values}
    if found := problems(entry):
        raise ValueError(f"said({name!r}): {'; '.join(found)}")
    return entry


def _value_problems(field: str, v) -> list[str]:
    if v is None or isinstance(v, (bool, int, float)):
        return []
    if isinstance(v, (list, tuple)):
        return [p for x in v for p in _value_problems(field, x)]
    if isinstance(v, dict):
        return [p for k, x in v.items() for p in _value_problems(field, k) + _value_problems(field, x)]
    if isinstance(v, str):
        if field in VERBATIM:
            return []
        if SENTENCE.search(v) or len(WORD.findall(v)) > MAX_WORDS:
            return [f"field {field!r} holds text, not a value or a name: {v[:60]!r}"]
        return []
    return [f"field {field!r} holds a {type(v).__name__}"]


def problems(entry) -> list[str]:
    """Why `entry` is not a template of DETAILS filled with values (empty: it is)."""
    if not isinstance(entry, dict) or set(entry) != {"template", "values"} or not isinstance(entry["values"], dict):
        return [f"not a said() entry: {str(entry)[:80]!r}"]
    name, values = entry["template"], entry["values"]
    if name not in DETAILS:
        return [f"no template {name!r} in DETAILS"]
    if set(values) != fields(DETAILS[name]):
        return [f"template {name!r} takes {sorted(fields(DETAILS[name]))}, given {sorted(values)}"]
    return [p for k, v in values.items() for p in _value_problems(k, v)]


def render(entries: list[dict]) -> str:
    """The text of a claim's details (or indicative reason): each entry's template filled, in order."""
    return " ".join(_FILL.format(DETAILS[e["template"]], **e["values"]) for e in entries)
