"""One record per claim of the module, the row of the lab's table and of results.json.

Verdicts:
    reproduced            the measurement agrees with the module within `tolerance`
    differs               it does not; `details` says how and why it may differ
    not measurable here   with the reason in `details` (a timing whose repeat-to-repeat spread
                          exceeds the effect, a model too small to use what is measured, ...)
    not run (full lab only)  measurable on this machine, but only `llamablock lab` without --quick runs
                          it (a real model past its context); carries its tolerance, and is counted
                          apart from "not measurable here", which says the measurement cannot decide
    definition            the statement holds by construction (the formula itself, a count the
                          module's own definition fixes); computed and shown, never counted as
                          reproduced, because no implementation could make it come out otherwise

`indicative` (a reason, or "") marks a verdict that rests on too little to be trusted at this
size: quick runs of the training claims. tests/lab/test_lab.py breaks every check that can
fail and requires the verdict differs: a check that reads "not measurable" against a broken
implementation has not shown that it can fail.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
    details: str = ""
    indicative: str = ""  # why this verdict is indicative only ("" when it is not)
    table: list[dict] = field(default_factory=list)  # rows for a small table in the report, when any
    plots: list[str] = field(default_factory=list)  # PNG files, relative to the report

    def judge(self, agrees: bool, details: str = "") -> Claim:
        self.verdict = REPRODUCED if agrees else DIFFERS
        if details:
            self.details = details
        return self

    def define(self, details: str = "") -> Claim:
        """Holds by construction: shown, not counted as a reproduction."""
        self.verdict = DEFINITION
        if details:
            self.details = details
        return self

    def unmeasurable(self, reason: str) -> Claim:
        self.verdict, self.details = NOT_MEASURABLE, reason
        return self

    def not_run(self, reason: str) -> Claim:
        """Skipped by --quick, not undecidable: the full lab measures it."""
        self.verdict, self.details = NOT_RUN, reason
        return self

    def to_dict(self) -> dict:
        return asdict(self)
