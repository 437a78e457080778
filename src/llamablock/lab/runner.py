"""Run the lab's experiments, print the table, write report.md, results.json and the plots.

Each experiment module has `run(quick, out_dir) -> list[Claim]`. One that crashes is recorded
as not measurable with its error, so the rest of the report still appears, and the exit status
stays 0: the lab reports what it found, whatever the verdicts.
"""

from __future__ import annotations

import importlib
import json
import platform
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

import torch
from tqdm import tqdm

from llamablock.lab.details_text import said
from llamablock.lab.record import Claim
from llamablock.util.files import atomic_write

# (module, the sections its claims belong to, title) in the module's order. Those that train small
# models or run a real one come last: the quick lab shows every exact claim within seconds.
EXPERIMENTS = [
    ("llamablock.lab.exp_rope", ("15.1",), "Rotary position embedding"),
    ("llamablock.lab.exp_scaling", ("15.2",), "Stretching RoPE, and ALiBi"),
    ("llamablock.lab.exp_norm", ("15.3",), "RMSNorm"),
    ("llamablock.lab.exp_ffn", ("15.4",), "SwiGLU"),
    ("llamablock.lab.exp_gqa", ("15.5",), "Grouped-query attention"),
    ("llamablock.lab.exp_decode_share", ("15.5",), "A decode step: the cache's share"),
    ("llamablock.lab.exp_blocks", ("15.6", "exercises"), "The two blocks side by side, and the exercises"),
    ("llamablock.lab.exp_training", ("15.3", "15.4", "15.5", "15.6"), "Training: ablation and MHA -> GQA"),
    ("llamablock.lab.exp_norm_parts", ("15.3",), "Training: which part of LayerNorm keeps training stable"),
    ("llamablock.lab.exp_long", ("15.2", "15.6"), "Training: long context and the tracer"),
    ("llamablock.lab.exp_extend_real", ("15.2",), "Context extension on SmolLM2-135M past its trained length"),
    ("llamablock.lab.exp_beyond", ("beyond",), "Beyond the module: q/k norm and sandwich norms"),
]
SECTIONS = ("15.1", "15.2", "15.3", "15.4", "15.5", "15.6", "exercises", "beyond")


def parse_only(only: list[str] | None) -> tuple[list[tuple], list[str] | None]:
    """`--only` takes sections ("15.3", "exercises") or claim ids and their prefixes ("15.5.cache",
    "ex."). Returns the experiments that can produce them and the prefixes to keep (None: all)."""
    if not only:
        return EXPERIMENTS, None
    chosen = []
    for o in only:
        found = [e for e in EXPERIMENTS if o in e[1] or any(i.startswith(o) for i in claim_ids(e[0]))]
        if not found:
            raise ValueError(f"--only {o!r} matches no experiment; give a section ({', '.join(SECTIONS)}) "
                             "or a claim id such as 15.5.cache-bytes")
        chosen += [e for e in found if e not in chosen]
    return [e for e in EXPERIMENTS if e in chosen], list(only)


def claim_ids(module: str) -> tuple[str, ...]:
    return importlib.import_module(module).CLAIMS


def declared(section: str) -> list[str]:
    """The claim ids the lab's experiments declare for `section`, in the experiments' order."""
    prefix = {"exercises": "ex.", "beyond": "beyond."}.get(section, section + ".")
    return [i for module, *_ in EXPERIMENTS for i in claim_ids(module) if i.startswith(prefix)]


def run_lab(out: Path, quick: bool = True, only: list[str] | None = None, progress: bool = True) -> list[Claim]:
    experiments, keep = parse_only(only)
    out.mkdir(parents=True, exist_ok=True)
    claims: list[Claim] = []
    timings: dict[str, float] = {}
    bar = tqdm(experiments, desc="lab", unit="section", disable=not progress)
    for module, sections, title in bar:
        section = sections[0]
        bar.set_postfix_str(title)
        started = time.perf_counter()
        try:
            found = importlib.import_module(module).run(quick, out)
        except Exception as e:  # an experiment's bug must not hide the others' results
            found = [Claim(f"{section}.experiment-error", section, f"{title}: the experiment failed", None).unmeasurable(
                said("experiment-error", error=f"{type(e).__name__}: {e}; {traceback.format_exc(limit=2)}"))]
        timings[title] = time.perf_counter() - started
        claims += found
    if keep:
        claims = [c for c in claims if any(c.section == k or c.id.startswith(k) for k in keep)]
    write_results(out, claims, quick, timings)
    return claims


def environment() -> dict:
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version(),
            "torch": torch.__version__, "machine": platform.machine(), "processor": platform.processor() or "",
            "threads": torch.get_num_threads()}


def write_results(out: Path, claims: list[Claim], quick: bool, timings: dict[str, float] | None = None) -> None:
    """results.json, then report.md written from what results.json holds (read back, so the report
    can say nothing the file does not)."""
    from llamablock.lab.report import document, render_report

    doc = document(claims, environment(), quick, timings, {s: declared(s) for s in SECTIONS})
    text = json.dumps(doc, indent=2, default=str)
    atomic_write(out / "results.json", lambda p: p.write_text(text))
    atomic_write(out / "report.md", lambda p: p.write_text(render_report(json.loads(text))))


def _short(value, width: int) -> str:
    from llamablock.lab.report import fmt

    text = fmt(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def table(claims: list[Claim]) -> str:
    from llamablock.lab.report import headline

    head = f"{'id':<30} {'claim':<44} {'module':<22} {'measured':<22} verdict"
    rows = [head, "-" * len(head)]
    for c in claims:
        rows.append(f"{c.id:<30} {_short(c.claim, 44):<44} {_short(c.source_value, 22):<22} "
                    f"{_short(c.measured, 22):<22} {c.verdict}{' (indicative)' if c.indicative else ''}")
    return "\n".join(rows + ["", " ".join(headline(claims))])
