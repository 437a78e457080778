"""How a command runs its model, decided whole before any weight is read (`decide`), and the engine
built by obeying it (`build`). Every command that runs a model begins the same way (gpt-fast's main():
resolve once, load once, compile in one `if`):

    source = open_source(args.model)                          # io/source.py: read once
    plan = decide(source, args.dtype, args.engine, device)    # every choice, and why
    built = build(source, plan)                               # the weights read once

`decide` reads the source's header facts, the builds index (fast/compiled/builds.py) and this
process's Machine record (fast/machine.py); nothing else reads process-wide state, and the
layers are handed what the plan says (tests/fast/test_plan.py states the rules as a table):
- Device: the packed formats and the compiled engine run on the CPU; elsewhere the engine is
  eager and `auto` is the float format (float32 for an all-F32 file or a float32 directory).
- Engine: `compiled` when asked; `auto` is compiled when the builds index records a build of this
  file, format, KV dtype and scaling by this llamablock and torch, else eager, with a note saying why.
- Formats (eager `auto` on a GGUF): each stored type in its own precision. The kernel's types
  (ggml_kernel.KEPT: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) as the file's blocks where the
  block kernel built (else re-quantized, and the plan says why: 4-bit types q4, Q4_K keeping its
  ids, 5- and 6-bit q8), other quantized types likewise, F16/BF16 bfloat16. Activations
  are float32 for an all-F32 file or one whose quantized matrices are all blocks, else bfloat16
  (the packed kernels' dtype). The output head stays 8-bit where its type would be packed, as
  in quantize_model; a tied embedding stored quantized is the head's rows (one copy).
- The compiled engine runs one format: the file's blocks where every layer matrix is a kept
  block type, else the one most layer matrices map to (it quantizes its fused q/k/v itself).
- Blocks: eager layers call the kernel by ctypes, compiled programs the torch operator; rows in groups
  of 8 where this CPU's build is faster so; a prompt from Machine.prefill's blocks rows: a float GEMM.
- KV cache (`kv_dtype`, --kv-dtype): the CPU's 16-bit type (Machine.kv16) for a quantized model with float32
  activations, else the activations' dtype; a 16-bit one read upcast to float32, but in place by eager decode
  steps where the kernel built (`cache_reader`: fast/kernels/cache_attention.py); prompts' in chunks (prompt_attention).
- Decode steps in C (`c_step`): an eager engine over a GGUF whose layer matrices are all blocks, activations float32,
  steps through every layer in one C call (fast/decode_step.py; the LLaMA block: config_reason)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn

from llamablock.fast import decode_step
from llamablock.fast import machine as machines
from llamablock.fast.compiled import builds
from llamablock.fast.formats import CHOICES, FORMATS, GGUF_TYPES, PACKED, dir_format, load_dtype
from llamablock.fast.kernels import cache_attention, prompt_attention
from llamablock.fast.kernels.ggml_kernel import BLOCK_BYTES, GROUPABLE
from llamablock.fast.kernels.native import native_decoder
from llamablock.fast.kernels.quant import apply_dtype
from llamablock.fast.machine import Machine
from llamablock.io.gguf_fast_reader import reader_choice
from llamablock.io.loading import load_decoder
from llamablock.io.source import ModelSource
from llamablock.rope_scaling import follows_length, rope_type
from llamablock.runtime.engine import EagerEngine

ENGINES = ("auto", "eager", "compiled")
KV_DTYPES = ("auto", "float32", "bfloat16", "float16")
FLOATS = frozenset({"F32", "F16", "BF16"})


@dataclass(frozen=True)
class Plan:
    engine: str  # "eager" or "compiled"
    fmt: str  # the --dtype asked for; the compiled engine's one format; "auto": each stored type's own
    device: str
    formats: dict = field(default_factory=dict)  # stored type (a GGUF's, or "*" for a directory) -> format
    activations: str = "float32"  # the dtype of activations, norms and float weights
    head: str = "float32"  # the output head's format
    binding: str | None = None  # how block layers call the kernel: "ctypes", "operator", or None (no blocks)
    grouped: bool = False  # block layers of a GROUPABLE type hold their rows in groups of 8
    prefill: dict = field(default_factory=dict)  # q8, q4, blocks -> rows from which it dequantizes (None: never)
    context: int = 0  # tokens the model runs at most (its config's max_seq_len)
    scaling: str = "none"  # the RoPE scaling in force (its config's)
    built: int | None = None  # the recorded build's cache length (compiled), else None
    autotune: bool = True  # the recorded build's setting: its packages' names hash it
    note: str | None = None  # said with the summary: why eager where a compiled engine could run
    batch: int = 1  # sequences the compiled step decodes at once (a server's --parallel)
    reasons: tuple[str, ...] = ()  # why a stored type runs other than as stored
    machine: str = ""  # the Machine record's description, for --verbose
    reader: str = ""  # which GGUF header reader read the file, and why (io/gguf_fast_reader.py)
    kv: str = "float32"  # the KV cache's dtype (kv_dtype)
    scaled: str = ""  # the flags' context and RoPE scaling where they rescaled it (builds.scaled_name), else ""
    cache_reader: bool = False  # eager decode steps read the 16-bit KV cache in place (the module docstring)
    c_step: bool = False  # eager decode steps run through every layer in one C call (the module docstring)

    @property
    def serving(self) -> str:
        """How a server decodes: "compiled batch" (the compiled step, a row bucket per row count) or "batch" (eager)."""
        return "compiled batch" if self.engine == "compiled" else "batch"

    def weights(self) -> str:
        """One line: each stored type's format, the head's, the activations, and how blocks are called."""
        kinds = ", ".join(f"{t} -> {f}" if t != "*" else f for t, f in sorted(self.formats.items()))
        grouped = sorted(t for t, f in self.formats.items() if f == "blocks" and t in GROUPABLE) if self.grouped else []
        blocks = (f"; the block kernel through {self.binding}"
                  f"{', ' + ', '.join(grouped) + ' rows in groups of 8' if grouped else ''}" if self.binding else "")
        return f"{kinds}; output head {self.head}; activations {self.activations}{blocks}"

    def describe(self) -> str:
        """What the run will do, before it loads: what `--verbose` prints."""
        built = f", built for {self.built} tokens" if self.built else ""
        engine = f"{self.engine} engine on {self.device}{built}{', its decode steps in C' * self.c_step}"
        in_c = " (its steps in C)" * self.c_step  # c_step: an eager plan, served by the batch engine
        lines = [f"plan: {engine}, batch {self.batch}; a server decodes with the {self.serving} engine{in_c}",
                 f"  weights: {self.weights()}",
                 f"  context: {self.context} tokens, RoPE scaling {self.scaling}; KV cache {self.kv}"
                 f"{', read in place by decode steps' if self.cache_reader else ''}"]
        if used := [f for f in self.prefill if f in (*self.formats.values(), self.head)]:  # for a GEMM
            lines.append("  prefill: " + ", ".join(f"{f} dequantizes from {self.prefill[f]} rows" if self.prefill[f]
                                                   is not None else f"{f} never dequantizes" for f in used))
        lines += [f"  {why}" for why in self.reasons] + ([f"  {self.note}"] if self.note else [])
        lines += [f"  {label}: {text}" for label, text in (("machine", self.machine), ("header", self.reader)) if text]
        return "\n".join(lines)


def layer_matrices(source: ModelSource) -> list[str]:
    """The stored type of each of a GGUF's layer matrices (`blk.N.*.weight`): the one definition of
    "a layer matrix", which the compiled engine's format and `--dtype blocks` follow."""
    return [kind for name, kind in source.stored.items() if name.startswith("blk.") and name.endswith(".weight")]


def matrix_types(source: ModelSource, layers_only: bool = False) -> set[str]:
    """The stored types of a GGUF's matrices (of its layer matrices alone with `layers_only`)."""
    return set(layer_matrices(source)) if layers_only else set(source.stored.values())


def float_format(source: ModelSource) -> str:
    """float32 for an all-F32 GGUF or a float32 directory, else bfloat16: `auto` off the CPU."""
    if source.kind != "gguf":
        return dir_format(source.stored["*"], source.where)
    return "float32" if matrix_types(source) <= {"F32"} else "bfloat16"


def own_format(source: ModelSource, machine: Machine | None = None) -> str:
    """The one format a compiled engine runs `source` in under `auto`: "blocks" for a GGUF whose layer
    matrices are all kept blocks, else the format most of them map to, or a directory's dtype."""
    if source.kind != "gguf":
        return dir_format(source.stored["*"], source.where)
    stored = matrix_types(source, layers_only=True)
    if stored and stored <= (machine or machines.this_machine()).kept:
        return "blocks"  # the file's own blocks, which the compiled engine fuses as they are
    layers = Counter(GGUF_TYPES.get(kind, "float32") for kind in layer_matrices(source))
    return layers.most_common(1)[0][0] if layers else "float32"


def _own_precision(source: ModelSource, machine: Machine, binding: str) -> dict:
    """Plan fields for a GGUF run in its own precision (the module docstring's rules)."""
    types, kept = matrix_types(source), machine.kept
    packed = types - kept - FLOATS
    act = "float32" if types <= {"F32"} or (types & kept and not packed) else "bfloat16"
    formats = {t: "blocks" if t in kept else act if t in FLOATS else GGUF_TYPES.get(t, act) for t in types}
    if source.cfg.tie_embeddings:  # the head is the embedding's rows
        embed = source.stored.get("token_embd.weight")
        head = (("blocks" if embed in kept else "q8") if GGUF_TYPES.get(embed) in PACKED else
                "q8" if act == "bfloat16" else act)
    else:
        f = formats.get(source.stored.get("output.weight"), act)
        head = "blocks" if f == "blocks" else "q8" if f in PACKED else act
    blocks = "blocks" in (*formats.values(), head)
    requantized = sorted(types & set(BLOCK_BYTES) - kept)
    reasons = (f"{', '.join(requantized)} re-quantized: {machine.why_not}",) if requantized else ()
    return dict(formats=formats, activations=act, head=head, binding=binding if blocks else None,
                grouped=blocks and machine.grouped, reasons=reasons)


def kv_dtype(asked: str, fields: dict, kv16: str) -> str:
    """`asked` (--kv-dtype) unless "auto"; for a quantized model (packed or blocks formats) with float32
    activations `kv16`, the CPU's 16-bit type (Machine.kv16); else the activations' dtype."""
    if asked not in KV_DTYPES:
        raise ValueError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {asked!r}")
    quantized = {*fields["formats"].values(), fields.get("head")} & {*PACKED, "blocks"}
    return (kv16 if quantized and fields["activations"] == "float32" else fields["activations"]) if asked == "auto" else asked


def _in_format(source: ModelSource, fmt: str, machine: Machine, binding: str = "ctypes") -> dict:
    """Plan fields for every weight in one format `fmt` (fast/formats.py FORMATS)."""
    if fmt == "blocks":
        layers = matrix_types(source, layers_only=True)
        if source.kind != "gguf" or not layers or not layers <= machine.kept:
            why = (f"{source.where} is not a GGUF file" if source.kind != "gguf" else
                   f"the block kernel is not available here ({machine.why_not})" if not machine.kept else
                   f"its layer matrices are {', '.join(sorted(layers))}")
            raise ValueError(f"--dtype blocks runs a GGUF whose layer matrices are all "
                             f"{', '.join(sorted(BLOCK_BYTES))}, and {why}; use --dtype auto")
        return _own_precision(source, machine, binding)
    act = str(load_dtype(fmt)).removeprefix("torch.")
    types = matrix_types(source) if source.kind == "gguf" else {"*"}
    return dict(formats={t: fmt for t in types}, activations=act, head="q8" if fmt in PACKED else fmt)


def decide(source: ModelSource, fmt: str = "auto", engine: str = "auto", device: str = "cpu", batch: int = 1,
           machine: Machine | None = None, rescaled: bool = False, kv: str = "auto") -> Plan:
    """The plan for running `source`: `fmt` one of formats.CHOICES, `engine` one of ENGINES,
    `device` a resolved device name (util/devices.resolve_device); `batch` the sequences a compiled
    step decodes at once (its builds are recorded apart); `machine` this process's (fast/machine.py)
    unless a test simulates another. `rescaled`: the command's flags changed the source's context or
    RoPE scaling (io/scaling_flags.py): its builds are recorded apart (builds.scaled_name). A scaling whose
    frequencies follow the length (dynamic NTK, LongRoPE), the flags' or the model's own, is never compiled.
    A plan that cannot run is refused here (ValueError), before anything is loaded. `kv`: --kv-dtype (kv_dtype)."""
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if fmt not in CHOICES:
        raise ValueError(f"--dtype must be one of {', '.join(CHOICES)}, got {fmt!r}")
    cfg, which = source.cfg, "--rope-scaling" if rescaled else "the model's own RoPE scaling"
    eager_only = follows_length(cfg)  # each pass's own frequencies: the static step has one set
    if eager_only and engine == "compiled":
        raise ValueError(f"{which} {rope_type(cfg)} changes RoPE's frequencies with the length, which a "
                         "compiled step cannot: run it with --engine eager (`llamablock compile` has nothing to build for it)")
    scaling = cfg.rope_scaling or {}
    common = dict(context=cfg.max_seq_len, scaling=scaling.get("rope_type") or scaling.get("type") or "none",
                  batch=batch, reader=reader_choice().reason if source.kind == "gguf" else "")
    if device != "cpu":
        if engine == "compiled":
            raise ValueError(f"the compiled engine runs on the CPU; use --device cpu, or --engine eager on {device}")
        if fmt in PACKED or fmt == "blocks":
            raise ValueError(f"--dtype {fmt} runs on the CPU only (PyTorch's packed int8/int4 kernels and the block "
                             f"kernel); use --device cpu, or bfloat16 on {device}")
        f = float_format(source) if fmt == "auto" else fmt
        types = matrix_types(source) if source.kind == "gguf" else {"*"}
        kv = kv_dtype(kv, dict(formats={}, activations=f), "")
        return Plan("eager", f, device, {t: f for t in types}, f, f, kv=kv, **common)
    machine = machine or machines.this_machine()
    common.update(machine=machine.describe(), prefill=dict(machine.prefill))
    built, common["scaled"] = None, builds.scaled_name(cfg) if rescaled else ""  # rescaled: its own builds
    if engine != "eager" and not eager_only and (engine == "compiled" or builds.any_build(source.path)):
        compiled_fmt = own_format(source, machine) if fmt == "auto" else fmt
        fields = _in_format(source, compiled_fmt, machine, binding="operator")
        fields["kv"] = kv_dtype(kv, fields, machine.kv16)
        name = builds.build_name(compiled_fmt, fields["kv"], fields["activations"], common["scaled"])
        built = builds.built_length(source.path, name, batch)
    if engine == "eager" or eager_only or (engine == "auto" and built is None):
        note = (None if engine == "eager" else "eager engine: a compiled step cannot follow a length-dependent "
                "RoPE scaling" if eager_only else "eager engine: no compiled build for the context and RoPE "
                "scaling these flags set; `llamablock compile` with the same flags builds one" if rescaled
                else builds.not_built_note(source, batch))
        fields = (_own_precision(source, machine, "ctypes") if fmt == "auto" and source.kind == "gguf" else
                  _in_format(source, dir_format(source.stored["*"], source.where) if fmt == "auto" else fmt, machine))
        kv = kv_dtype(kv, fields, machine.kv16)
        kernel32 = machine.kernel and fields["activations"] == "float32"  # the cache reader's and C step's ground
        c_step = kernel32 and source.kind == "gguf" and decode_step.config_reason(cfg) is None and all(
            fields["formats"][t] == "blocks" for t in layer_matrices(source))
        return Plan("eager", fmt, device, note=note, kv=kv, cache_reader=kernel32 and kv != "float32", c_step=c_step,
                    **fields, **common)
    return Plan("compiled", compiled_fmt, device, built=built, autotune=builds.autotuned(source.path, name),
                **fields, **common)


@dataclass
class Built:
    model: nn.Module  # the eager model: what the eager engine runs
    engine: object  # what generation runs (runtime/engine.py's interface)


def _binding(plan: Plan, notify=None):
    """The function block layers call: the ctypes kernel, or the torch operator compiled programs trace (where it
    cannot be built, the ctypes kernel with one line), with Machine.prefill's blocks rows (matmul's gemm_from)."""
    from llamablock.fast.kernels import block_op, ggml_kernel

    operator = plan.binding == "operator" and block_op.load()
    if plan.binding == "operator" and not operator:
        (notify or print)(f"{block_op.why_not()}: the programs cannot call the blocks, and run eagerly")
    return functools.partial(block_op.linear if operator else ggml_kernel.matmul, gemm_from=plan.prefill.get("blocks"))


def _native(source: ModelSource, plan: Plan, notify=None) -> tuple[nn.Module, dict]:
    """(model, {format: tensors}) of a GGUF in the plan's per-type formats."""
    return native_decoder(source.index, source.cfg, plan.formats, getattr(torch, plan.activations), head=plan.head,
                          binding=_binding(plan, notify), grouped=plan.grouped, prefill=plan.prefill)


def load_model(source: ModelSource, plan: Plan, notify=None) -> tuple[nn.Module, str]:
    """(model, what) as `plan` says, the weights read once; `what`: the weights' formats in one line."""
    if plan.device != "cpu":
        return load_decoder(source, load_dtype(plan.fmt)).to(plan.device), f"{plan.fmt} on {plan.device}"
    if source.kind == "gguf" and (plan.fmt in ("auto", "blocks")):
        model, used = _native(source, plan, notify)
        what = ", ".join(f"{n} tensors {f}" for f, n in sorted(used.items()))
        what += "".join(f" ({why})" for why in plan.reasons)
        return model, "blocks" if plan.fmt == "blocks" and plan.engine == "eager" else f"the file's own precision: {what}"
    fmt = plan.fmt if plan.fmt in FORMATS else next(iter(plan.formats.values()))
    if plan.engine == "compiled":  # the engine quantizes its fused weights itself
        return load_decoder(source, load_dtype(fmt)), fmt
    return apply_dtype(load_decoder(source, load_dtype(fmt)), fmt, plan.prefill), fmt


def build(source: ModelSource, plan: Plan, notify=None) -> Built:
    """The model and engine of `plan`, reading the weights once. A compiled engine is not prepared
    here (`prepare` does it, loading or compiling its programs); `notify` gets its build lines."""
    model, what = load_model(source, plan, notify)
    if plan.engine == "eager":
        if plan.cache_reader:
            cache_attention.attach(model)
        prompt_attention.attach(model)  # a prompt's causal attention in chunks, where it covers the call
        engine = decode_step.DecodeStepEngine if plan.c_step else EagerEngine
        return Built(model, engine(model, what, kv_dtype=getattr(torch, plan.kv)))
    from llamablock.fast.compiled.aoti_engine import AOTIEngine
    return Built(model, AOTIEngine(model, plan.fmt, autotune=plan.autotune, notify=notify, batch=plan.batch,
                                   prefill=plan.prefill, kv_dtype=getattr(torch, plan.kv),
                                   weights_id=builds.weights_identity(source.path, plan.fmt, plan.grouped)))


def eager_beside(built: Built, plan: Plan) -> nn.Module:
    """An eager model beside a compiled engine, from the weights already read (a server runs the requests its engine
    does not cover on it): the engine's float model itself, or for q8/q4 a quantized copy (the dequantize-then-quantize
    path, whose logits equal the native load's for a file of one format: tests/fast/kernels/test_native.py); a file
    mixing formats runs in the engine's one format here."""
    fmt = built.engine.fmt
    return apply_dtype(copy.deepcopy(built.model), fmt, plan.prefill) if fmt in PACKED else built.model


def load_in_format(source: ModelSource, fmt: str = "auto", device: str = "cpu",
                   machine: Machine | None = None) -> tuple[nn.Module, str]:
    """(model, what) of the eager plan for `source` in `fmt`: the one-call form for benchmarks and tests."""
    return load_model(source, decide(source, fmt, "eager", device, machine=machine))


def load_gguf_native(path, rope_layout: str = "half", engine: str = "eager") -> tuple[nn.Module, dict]:
    """(model, {format: tensors}) of a GGUF file by path in its own precision, its q/k rows in `rope_layout`, as the
    `engine` ("eager", or "compiled": block layers bound to the operator programs call) would load it: for tests."""
    from llamablock.io.source import open_source

    source = open_source(path, tokenizer=False)
    source = dataclasses.replace(source, cfg=source.cfg.replace(rope_layout=rope_layout))
    plan = decide(source, "auto", "eager")
    if engine == "compiled":
        plan = dataclasses.replace(plan, engine="compiled", binding=plan.binding and "operator")
    return _native(source, plan)


def prepare(engine, source: ModelSource, total_tokens: int, scaled: str = "") -> float:
    """Make `engine` ready for `total_tokens` (loading or compiling a compiled engine's programs) and record a
    compiled build (fast/compiled/builds.py; `scaled`: the plan's), so that later commands choose it; seconds compiling."""
    seconds = engine.prepare(total_tokens) or 0.0
    running = getattr(engine, "running", None)
    if running is not None and running.get("step") != "eager":  # a step run eagerly is no build to choose
        builds.record_engine(source.path, engine, seconds, scaled)
    return seconds
