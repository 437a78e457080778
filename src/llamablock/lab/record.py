"""One record per claim of the module, the row of the lab's table and of results.json.

Verdicts:
    reproduced            the measurement agrees with the module within `tolerance`
    differs               it does not; `details` say how and why it may differ
    not measurable here   with the reason in `details` (a timing whose repeat-to-repeat spread
                          exceeds the effect, a model too small to use what is measured, ...)
    not run (full lab only)  measurable on this machine, but only `llamablock lab` without --quick runs
                          it (a real model past its context); carries its tolerance, and is counted
                          apart from "not measurable here", which says the measurement cannot decide
    definition            the statement holds by construction (the formula itself, a count the
                          module's own definition fixes); computed and shown, never counted as
                          reproduced, because no implementation could make it come out otherwise

`details` and `indicative` hold no sentence: each is a list of said() entries (a template of
details_text.DETAILS and the run's values that fill it), which report.py renders. `indicative`
(the reason, or empty) marks a verdict that rests on too little to be trusted at this size: quick
runs of the training claims. tests/lab/test_lab.py breaks every check that can
fail and requires the verdict differs: a check that reads "not measurable" against a broken
implementation has not shown that it can fail.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from llamablock.lab.details_text import problems

REPRODUCED, DIFFERS, NOT_MEASURABLE, DEFINITION = "reproduced", "differs", "not measurable here", "definition"
NOT_RUN = "not run (full lab only)"
VERDICTS = (REPRODUCED, DIFFERS, NOT_MEASURABLE, NOT_RUN, DEFINITION)


@dataclass
class Claim:
    id: str  # stable, e.g. "15.1.rope-2d-offset"
    section: str  # "15.1"
    claim: str  # the module's statement in a few words
    source_value: Any  # the module's figure (None where it states no number)
    measured: Any = None
    unit: str = ""
    tolerance: str = ""  # how agreement is judged, in words or as a number
    verdict: str = NOT_MEASURABLE
    details: list[dict] = field(default_factory=list)  # said() entries: how it was measured, why it may differ
    indicative: list[dict] = field(default_factory=list)  # said() entries: why it is indicative only (empty: it is not)
    table: list[dict] = field(default_factory=list)  # rows for a small table in the report, when any
    plots: list[str] = field(default_factory=list)  # PNG files, relative to the report

    def _say(self, verdict: str, lines: tuple) -> Claim:
        for line in lines:
            if found := problems(line):
                raise TypeError(f"{self.id}: details are said() entries, not text: {'; '.join(found)}")
        self.verdict = verdict
        if lines:
            self.details = list(lines)
        return self

    def judge(self, agrees: bool, *details: dict) -> Claim:
        return self._say(REPRODUCED if agrees else DIFFERS, details)

    def define(self, *details: dict) -> Claim:
        """Holds by construction: shown, not counted as a reproduction."""
        return self._say(DEFINITION, details)

    def unmeasurable(self, *reason: dict) -> Claim:
        return self._say(NOT_MEASURABLE, reason)

    def not_run(self, *reason: dict) -> Claim:
        """Skipped by --quick, not undecidable: the full lab measures it."""
        return self._say(NOT_RUN, reason)

    def to_dict(self) -> dict:
        return asdict(self)
