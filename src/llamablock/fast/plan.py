"""How a command runs its model, decided once (`decide`), and the engine built from it (`build`).

Every command that runs a model begins the same way (gpt-fast's main(): resolve once, load once,
compile in one `if`):

    source = open_source(args.model)                          # io/source.py: read once
    plan = decide(source, args.dtype, args.engine, device)    # engine, format, device, and why
    built = build(source, plan)                               # the weights read once

The rules:
- Device: the packed formats and the compiled engine run on the CPU; elsewhere the engine is
  eager and `auto` is the float format (fast/kernels/native.py float_format).
- Engine: `compiled` when asked; `auto` is compiled when fast/compiled/builds.py records a build of this
  file in this format by this llamablock and torch (`llamablock compile` made it), else eager,
  with a note that says how to build it (or that the build is another version's).
- Format: the eager engine's `auto` is every tensor in its stored format (fast/kernels/native.py); the
  compiled engine's is the file's majority format (native.own_format), since it quantizes its
  fused q/k/v itself.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn

from llamablock.fast.compiled import builds
from llamablock.fast.formats import CHOICES, PACKED, load_dtype
from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.kernels.native import float_format, kept_types, native_decoder, own_format
from llamablock.fast.kernels.quant import apply_dtype
from llamablock.io.loading import load_decoder
from llamablock.io.source import ModelSource
from llamablock.runtime.engine import EagerEngine

ENGINES = ("auto", "eager", "compiled")


@dataclass(frozen=True)
class Plan:
    engine: str  # "eager" or "compiled"
    fmt: str  # the weights' format (formats.FORMATS), or "auto" for the eager engine's per-tensor choice
    device: str
    built: int | None = None  # the recorded build's cache length (compiled), else None
    autotune: bool = True  # the recorded build's setting: its packages' names hash it
    note: str | None = None  # said with the summary: why eager where a compiled engine could run
    batch: int = 1  # sequences the compiled step decodes at once (a server's --parallel)


def decide(source: ModelSource, fmt: str = "auto", engine: str = "auto", device: str = "cpu",
           batch: int = 1) -> Plan:
    """The plan for running `source`: `fmt` one of formats.CHOICES, `engine` one of ENGINES,
    `device` a resolved device name (util/devices.resolve_device); `batch` the sequences a compiled
    step decodes at once (its builds are recorded apart)."""
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if device != "cpu":
        if engine == "compiled":
            raise ValueError(f"the compiled engine runs on the CPU; use --device cpu, or --engine eager on {device}")
        return Plan("eager", fmt, device)
    if engine == "eager":
        return Plan("eager", fmt, device)
    built = None
    if engine == "compiled" or builds.any_build(source.path):  # else the format is not needed
        compiled_fmt = own_format(source) if fmt == "auto" else fmt
        built = builds.built_length(source.path, compiled_fmt, batch)
    if engine == "auto" and built is None:
        flags = (f" --model {source.given}" if source.given else "") + (f" --batch {batch}" if batch > 1 else "")
        command, user = f"`llamablock compile{flags}`", "generate" if batch == 1 else "serve"
        note = (f"eager engine: the compiled one was built by another llamablock or torch; {command} builds it "
                "again" if builds.stale_build(source.path) else
                f"eager engine: {command} builds the compiled one once, then {user} uses it")
        return Plan("eager", fmt, device, note=note)
    return Plan("compiled", compiled_fmt, device, built, builds.autotuned(source.path, compiled_fmt), batch=batch)


@dataclass
class Built:
    model: nn.Module  # the eager model: what the eager engine runs
    engine: object  # what generation runs (runtime/engine.py's interface)


def build(source: ModelSource, plan: Plan, notify=None) -> Built:
    """The model and engine of `plan`, reading the weights once. A compiled engine is not prepared
    here (`prepare` does it, loading or compiling its programs); `notify` gets its build lines."""
    if plan.engine == "eager":
        model, what = load_in_format(source, plan.fmt, plan.device)
        return Built(model, EagerEngine(model, what))
    from llamablock.fast.compiled.compiled_decode import AOTIEngine

    model = load_in_format(source, "blocks")[0] if plan.fmt == "blocks" else load_decoder(source, load_dtype(plan.fmt))
    return Built(model, AOTIEngine(model, plan.fmt, autotune=plan.autotune, notify=notify, batch=plan.batch,
                                   weights_id=builds.weights_identity(source.path, plan.fmt)))


def eager_beside(built: Built) -> nn.Module:
    """An eager model beside a compiled engine, from the weights already read (a server runs the
    requests its engine does not cover on it): the engine's float model itself, or a quantized copy
    of it for q8/q4. That is the dequantize-then-quantize path, whose logits equal the native
    load's for a file of one format (tests/fast/kernels/test_native.py); a file mixing formats runs every
    weight in the engine's one format here, where the native load keeps each tensor's own."""
    fmt = built.engine.fmt
    return apply_dtype(copy.deepcopy(built.model), fmt) if fmt in PACKED else built.model


def load_in_format(source: ModelSource, fmt: str = "auto", device: str = "cpu") -> tuple[nn.Module, str]:
    """(model, what) for `source` with its weights in `fmt` (one of formats.CHOICES) on `device`;
    `what` says in one line which formats the weights run in, for the command line to print. The
    packed formats run on the CPU only: elsewhere `auto` runs the float format, and q8/q4 are refused."""
    if fmt not in CHOICES:
        raise ValueError(f"--dtype must be one of {', '.join(CHOICES)}, got {fmt!r}")
    if device != "cpu":
        if fmt in PACKED:
            raise ValueError(f"--dtype {fmt} runs on the CPU only (PyTorch's packed int8/int4 kernels); "
                             f"use --device cpu, or bfloat16 on {device}")
        fmt = float_format(source) if fmt == "auto" else fmt
        return load_decoder(source, load_dtype(fmt)).to(device), f"{fmt} on {device}"
    if fmt == "blocks":
        return _file_blocks(source), "blocks"
    if fmt == "auto" and source.kind == "gguf":
        model, used = native_decoder(source.index, source.cfg)
        what = ", ".join(f"{n} tensors {f}" for f, n in sorted(used.items()))
        blocks = sorted(set(source.stored.values()) & set(ggml_kernel.BLOCK_BYTES))
        if blocks and not kept_types():  # they ran re-quantized: say why
            what += f" ({', '.join(blocks)} re-quantized: {ggml_kernel.why_not()})"
        return model, f"the file's own precision: {what}"
    fmt = own_format(source) if fmt == "auto" else fmt
    return apply_dtype(load_decoder(source, load_dtype(fmt)), fmt), fmt


def _file_blocks(source: ModelSource) -> nn.Module:
    """The native model of a GGUF whose every layer matrix is a kept block type (`--dtype blocks`)."""
    layers = {kind for name, kind in source.stored.items() if name.startswith("blk.") and name.endswith(".weight")}
    if source.kind != "gguf" or not layers or not layers <= kept_types():
        why = (f"{source.where} is not a GGUF file" if source.kind != "gguf" else
               f"the block kernel is not available here ({ggml_kernel.why_not()})" if not kept_types() else
               f"its layer matrices are {', '.join(sorted(layers))}")
        raise ValueError(f"--dtype blocks runs a GGUF whose layer matrices are all Q4_0, Q4_1 or Q8_0, and {why}; "
                         "use --dtype auto")
    return native_decoder(source.index, source.cfg)[0]


def prepare(engine, source: ModelSource, total_tokens: int) -> float:
    """Make `engine` ready for `total_tokens` (loading or compiling a compiled engine's programs) and
    record a compiled build (fast/compiled/builds.py), so that later commands choose it; seconds compiling."""
    seconds = engine.prepare(total_tokens) or 0.0
    running = getattr(engine, "running", None)
    if running is not None and running.get("step") != "eager":  # a step run eagerly is no build to choose
        builds.record(source.path, engine.fmt, engine.length, engine.packages(), seconds, autotune=engine.autotune,
                      batch=engine.batch)
    return seconds

