"""One record per claim of the module, the row of the lab's table and of results.json.

Verdicts:
    reproduced            the measurement agrees with the module within `tolerance`
    differs               it does not; `details` says how
    not measurable here   with the reason in `details` (hardware, a skipped slow part, ...)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

REPRODUCED, DIFFERS, NOT_MEASURABLE = "reproduced", "differs", "not measurable here"


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
    plots: list[str] = field(default_factory=list)  # PNG files, relative to the report

    def judge(self, agrees: bool, details: str = "") -> "Claim":
        self.verdict = REPRODUCED if agrees else DIFFERS
        if details:
            self.details = details
        return self

    def unmeasurable(self, reason: str) -> "Claim":
        self.verdict, self.details = NOT_MEASURABLE, reason
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("plots")
        return d
