"""Run the benchmarks, print their tables, and write BENCHMARKS.md atomically.

    llamablock bench [--quick] [--output PATH] [--into PATH] [NAME ...]   (or: python -m benchmarks ...)

Each benchmark (a module named in BENCHMARKS) times its competitors interleaved in this one
process and returns tables (benchmarks.common.Section). The report starts with the machine,
versions, date and the load average at start, because on a shared machine absolute numbers
move with the load while the interleaved ratios hold better. A full run writes BENCHMARKS.md; a
run of a few benchmarks given `--into BENCHMARKS.md` puts their sections there (splice), each
under its own run's header, and leaves the others as they are. A benchmark whose result is a
property of the CPU kind (PER_CPU_KIND = True: `size`) heads its section "## NAME (KIND)", so a run
on an AVX2 machine sits beside the AMX one instead of replacing it.
"""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import time
from pathlib import Path

import torch

BENCHMARKS = {
    "attention": "benchmarks.bench_attention",
    "norm": "benchmarks.bench_norm",
    "rope": "benchmarks.bench_rope",
    "swiglu": "benchmarks.bench_swiglu",
    "train_step": "benchmarks.bench_train_step",
    "malloc": "benchmarks.bench_malloc",
    "decode": "benchmarks.bench_decode_quant",
    "long_prefill": "benchmarks.bench_long_prefill",
    "long_loss": "benchmarks.bench_long_loss",
    "prefill_crossover": "benchmarks.bench_prefill_crossover",
    "file_blocks": "benchmarks.bench_file_blocks",
    "cache_attention": "benchmarks.bench_cache_attention",
    "prompt_attention": "benchmarks.bench_prompt_attention",
    "activations": "benchmarks.bench_activations",
    "kquants": "benchmarks.bench_kquants",
    "compile_cache": "benchmarks.bench_compile_cache",
    "build": "benchmarks.bench_build",
    "huge_pages": "benchmarks.bench_huge_pages",
    "threads": "benchmarks.bench_threads",
    "memory": "benchmarks.bench_memory",
    "generate_command": "benchmarks.bench_generate_command",
    "startup": "benchmarks.bench_startup",
    "serve": "benchmarks.bench_serve",
    "size": "benchmarks.bench_size",
    "overflow": "benchmarks.bench_overflow",
    "scaled_perplexity": "benchmarks.bench_scaled_perplexity",
    "passkey": "benchmarks.bench_passkey",
}


def check_names(names: list[str]) -> list[str]:
    bad = [n for n in names if n not in BENCHMARKS]
    if bad:
        raise ValueError(f"unknown benchmark {', '.join(bad)}; choose from {', '.join(BENCHMARKS)}")
    return names or list(BENCHMARKS)


def machine() -> list[str]:
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from llamablock.fast.kernels.malloc import allocator_state
    from llamablock.util.cpu import this_cpu

    load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return [f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            f"- CPU: {cpu}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}",
            f"- CPU features: {this_cpu().describe()}; kind {this_cpu().kind} (llamablock.util.cpu)",
            f"- Load average at start (1 / 5 / 15 min): {load}",
            f"- Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}",
            f"- Allocator: {allocator_state()}"]


def to_markdown(section) -> list[str]:
    out = [f"### {section.title}", "", "| " + " | ".join(section.headers) + " |",
           "|" + "|".join("---" for _ in section.headers) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in section.rows]
    out += [""] + [f"- {n}" for n in section.notes] + [""]
    return out


def run_benchmarks(names: list[str], quick: bool = False, output: Path | None = None, preamble: str = "",
                   echo=print) -> str:
    """Run `names` (all when empty); return the markdown report; write it to `output` if given."""
    names = check_names(list(names))
    # settings that change which kernels run go in front of the command, so that the run can be repeated
    env = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "LLAMABLOCK_NO_KERNEL")
                   if k in os.environ)
    cmd = (env + " " if env else "") + "llamablock bench" + (" --quick" if quick else "") + \
        f" --threads {torch.get_num_threads()}"
    cmd += " " + " ".join(names) if names != list(BENCHMARKS) else ""
    lines = ["# Benchmarks", "", *machine(), f"- Command: `{cmd}`", ""]
    lines += ["Absolute times move with the machine's load (see the load average above; a machine shared with "
              "other jobs runs slower). Within each table the implementations were "
              "timed interleaved, round by round, in one process, so their ratios are the result to read. Every "
              "'Target' line is computed from this run's numbers. Regenerate with the command above "
              "(`llamablock bench` or `python -m benchmarks`; add `--threads N` to fix torch's thread count).", ""]
    if preamble:
        lines += [preamble, ""]
    for name in names:
        module = importlib.import_module(BENCHMARKS[name])
        t0 = time.perf_counter()
        sections = module.run(quick=quick)
        chunk = [f"## {heading(name, module)}", "", f"Claim: {module.CLAIM}.", ""]
        for s in sections:
            chunk += to_markdown(s)
        chunk += [f"_{name}: {time.perf_counter() - t0:.0f} s_", ""]
        echo("\n".join(chunk))
        lines += chunk
    report = "\n".join(lines)
    if output is not None:
        from llamablock.util.files import atomic_write

        atomic_write(Path(output), lambda tmp: Path(tmp).write_text(report + "\n", encoding="utf-8"))
    return report


def heading(name: str, module) -> str:
    """The section's heading: the benchmark's name, with the CPU kind (util.cpu) where its module asks."""
    if not getattr(module, "PER_CPU_KIND", False):
        return name
    from llamablock.util.cpu import this_cpu

    return f"{name} ({this_cpu().kind})"


def splice(report: str, text: str) -> str:
    """`text` (a report such as BENCHMARKS.md) with each benchmark section of `report` (a run of a few
    benchmarks) in place of its old section, or at the end when it has none; under each claim the
    run's own header (date, machine, load, command), since it is not the file's. Other sections stay
    as they are."""
    new = report.splitlines()
    header = new[2:new.index("", 2)]  # "- Date: ..." to "- Command: ..."
    old = text.rstrip("\n").splitlines()
    for name, chunk in _sections(new).items():
        while chunk and not chunk[-1]:
            chunk.pop()
        chunk = chunk[:4] + ["Run on its own (its own header):", *header, ""] + chunk[4:]
        start = old.index(f"## {name}") if f"## {name}" in old else len(old)
        end = next((i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old))
        if start == len(old) and old and old[-1]:
            chunk = ["", *chunk]
        old[start:end] = chunk + ([""] if end < len(old) else [])  # a blank line before the next section
    return "\n".join(old).rstrip("\n") + "\n"


def _sections(lines: list[str]) -> dict[str, list[str]]:
    """'## name' -> its lines (the heading, the claim, the tables, the time), in order."""
    out, name = {}, None
    for line in lines:
        if line.startswith("## "):
            name = line[3:].strip()
            out[name] = []
        if name is not None:
            out[name].append(line)
    return out


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks [--quick] [--output PATH] [--threads N] [NAME ...]` (what `llamablock
    bench` runs): a full run of every benchmark writes BENCHMARKS.md at the repository root."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="llamablock bench", description="speed benchmarks side by side; BENCHMARKS.md")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (seconds; for CI), no file written")
    p.add_argument("--output", type=Path, default=None,
                   help="where to write the markdown report (default: BENCHMARKS.md at the repository root "
                        "for a full run of all benchmarks, nowhere otherwise)")
    p.add_argument("--into", type=Path, default=None, metavar="PATH",
                   help="put the named benchmarks' sections into this existing report (BENCHMARKS.md) in place of "
                        "their old ones, or at its end, each under this run's header; the rest of it stays as it is")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = p.parse_args(argv)
    try:
        names = check_names(list(args.names))
        if args.threads is not None:
            if args.threads < 1:
                raise ValueError(f"--threads must be at least 1, got {args.threads}")
            torch.set_num_threads(args.threads)
    except ValueError as e:
        print(f"llamablock bench: error: {e}", file=sys.stderr)
        return 2
    from llamablock.fast.kernels.malloc import tune_allocator

    tune_allocator()  # as the command line sets it up, so the in-process benchmarks time what users run
    output = args.output
    if output is None and not args.quick and not args.names and args.into is None:
        output = repo_root() / "BENCHMARKS.md"
    if args.into is not None and (args.quick or not args.into.is_file()):
        why = "--quick's tiny sizes stay out of a report" if args.quick else "no such report to update"
        print(f"llamablock bench: error: --into {args.into}: {why}", file=sys.stderr)
        return 2
    report = run_benchmarks(names, quick=args.quick, output=output)
    if output is not None:
        print(f"wrote {output}")
    if args.into is not None:
        from llamablock.util.files import atomic_write

        spliced = splice(report, args.into.read_text(encoding="utf-8"))
        atomic_write(args.into, lambda tmp: Path(tmp).write_text(spliced, encoding="utf-8"))
        print(f"updated {', '.join(names)} in {args.into}")
    return 0
