"""The plan's rules as a table: (stored types, device, flags, builds present, kernel built, CPU kind)
-> what the run will do, decided without loading a model (fast/plan.py's docstring states the
rules; each row names the one it checks). Then that the layers obey the plan: the binding it
chose is the one a layer calls, whatever else the process has loaded.

The sources are header facts only (a path that does not exist, a tiny config, the stored types),
and the machines are simulated (fast/machine.py machine_for), so every row runs on any machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from llamablock.fast.compiled import builds
from llamablock.fast.kernels.ggml_kernel import GEMM_FROM_BY_CPU
from llamablock.fast.machine import machine_for, this_machine
from llamablock.fast.plan import decide
from llamablock.io.source import ModelSource
from llamablock.presets import preset
from llamablock.util.cpu import CPU

CPUS = {"AMX": CPU("sim", 2, "AVX512", frozenset({"avx512_f", "amx_bf16"})),
        "AVX-512": CPU("sim", 2, "AVX512", frozenset({"avx512_f"})),
        "AVX2": CPU("sim", 2, "AVX2", frozenset({"avx2"})), "other": CPU("sim", 2, "DEFAULT", frozenset()),
        "AVX-512 BF16": CPU("sim", 2, "AVX512", frozenset({"avx512_f", "avx512_bf16"})),
        "AMX as AVX2": CPU("sim", 2, "AVX2", frozenset({"avx2", "avx512_f", "avx512_bf16", "amx_bf16"}))}
NO_CC = "no C compiler (cc) on the PATH"

# What llama-quantize and the converters write: the matrices' stored types by tensor name.
Q4_1_TIED = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q4_1", "blk.0.ffn_down.weight": "Q4_1"}
Q4_0_Q6K_HEAD = {"token_embd.weight": "Q4_0", "output.weight": "Q6_K", "blk.0.attn_q.weight": "Q4_0",
                 "blk.0.ffn_down.weight": "Q4_0"}
Q4_K_M = {"token_embd.weight": "Q6_K", "output.weight": "Q6_K", "blk.0.attn_q.weight": "Q4_K",
          "blk.0.ffn_down.weight": "Q6_K"}
F32_ONLY = {"token_embd.weight": "F32", "output.weight": "F32", "blk.0.attn_q.weight": "F32"}
F16_TIED = {"token_embd.weight": "F16", "blk.0.attn_q.weight": "F16"}
Q5_MAJORITY = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q5_1", "blk.0.attn_k.weight": "Q5_1",
               "blk.0.ffn_down.weight": "Q4_0"}  # Q5_1: a type the kernel does not keep


def _source(stored: dict, tied: bool = False, kind: str = "gguf", scaling: str | None = None) -> ModelSource:
    cfg = preset("llama-2024-small", tie_embeddings=tied, max_seq_len=512)
    if scaling is not None:  # as --ctx-size 1024 --rope-scaling S sets it (io/scaling_flags.py)
        cfg = cfg.replace(max_seq_len=1024, rope_scaling={"rope_type": scaling, "factor": 2.0,
                                                          "original_max_position_embeddings": 512})
    return ModelSource(None, Path("/nonexistent/model.gguf"), kind, cfg, stored, where="model.gguf")


def _plan(stored, *, tied=False, kind="gguf", device="cpu", fmt="auto", engine="auto", built=None, stale=False,
          kernel=True, cpu="AVX-512", rescaled=False, kv="auto", scaling=None, monkeypatch=None):
    recorded = built is not None or stale
    monkeypatch.setattr(builds, "any_build", lambda path: recorded)
    monkeypatch.setattr(builds, "built_length", lambda path, f, batch=1: built)
    monkeypatch.setattr(builds, "stale_build", lambda path: stale)
    monkeypatch.setattr(builds, "autotuned", lambda path, f: True)
    machine = machine_for(CPUS[cpu], kernel, NO_CC)
    return decide(_source(stored, tied, kind, scaling), fmt, engine, device, machine=machine, rescaled=rescaled, kv=kv)


# (row id, source and flags, the plan's fields expected); "reason"/"note": a phrase the line holds
TABLE = [
    ("own blocks, grouped on AVX-512", dict(stored=Q4_1_TIED, tied=True),
     dict(engine="eager", formats={"Q4_1": "blocks", "Q8_0": "blocks"}, activations="float32", head="blocks",
          binding="ctypes", grouped=True, note="llamablock compile")),
    ("own blocks, grouped on AVX2", dict(stored=Q4_1_TIED, tied=True, cpu="AVX2"),
     dict(formats={"Q4_1": "blocks", "Q8_0": "blocks"}, grouped=True,
          prefill={"q8": None, "q4": None, "blocks": GEMM_FROM_BY_CPU["AVX2"]})),
    ("own blocks, the file's order on a portable build", dict(stored=Q4_1_TIED, tied=True, cpu="other"),
     dict(binding="ctypes", grouped=False)),
    ("no kernel: blocks re-quantized, and why", dict(stored=Q4_1_TIED, tied=True, kernel=False),
     dict(formats={"Q4_1": "q4", "Q8_0": "q8"}, activations="bfloat16", head="q8", binding=None, grouped=False,
          reason=f"Q4_1, Q8_0 re-quantized: {NO_CC}")),
    ("llama-quantize's Q4_0 with a Q6_K head: every matrix the file's blocks", dict(stored=Q4_0_Q6K_HEAD),
     dict(formats={"Q4_0": "blocks", "Q6_K": "blocks"}, activations="float32", head="blocks", binding="ctypes")),
    ("Q4_K_M as stored: the K types are blocks, in the file's order", dict(stored=Q4_K_M),
     dict(formats={"Q4_K": "blocks", "Q6_K": "blocks"}, activations="float32", head="blocks", binding="ctypes")),
    ("Q4_K_M without a kernel: 4-bit to q4 (Q4_K's ids kept), 6-bit to q8", dict(stored=Q4_K_M, kernel=False),
     dict(formats={"Q4_K": "q4", "Q6_K": "q8"}, activations="bfloat16", head="q8", binding=None,
          prefill={"q8": 64, "q4": 256, "blocks": None})),
    ("a type not kept among blocks: packed, and bfloat16 activations", dict(stored=Q5_MAJORITY),
     dict(formats={"Q5_1": "q8", "Q4_0": "blocks", "Q8_0": "blocks"}, activations="bfloat16", binding="ctypes")),
    ("all F32: float32 throughout", dict(stored=F32_ONLY),
     dict(formats={"F32": "float32"}, activations="float32", head="float32", binding=None)),
    ("a tied F16 table: bfloat16 and a q8 head", dict(stored=F16_TIED, tied=True),
     dict(formats={"F16": "bfloat16"}, activations="bfloat16", head="q8")),
    ("a directory runs its torch_dtype", dict(stored={"*": "float32"}, kind="transformers"),
     dict(formats={"*": "float32"}, activations="float32", head="float32")),
    ("off the CPU: the float format, eager", dict(stored=Q4_1_TIED, tied=True, device="cuda"),
     dict(engine="eager", formats={"Q4_1": "bfloat16", "Q8_0": "bfloat16"}, activations="bfloat16", binding=None)),
    ("--dtype q8 on a GGUF: every matrix q8", dict(stored=Q4_1_TIED, tied=True, fmt="q8"),
     dict(formats={"Q4_1": "q8", "Q8_0": "q8"}, activations="bfloat16", head="q8", binding=None)),
    ("--dtype blocks: the own precision, checked", dict(stored=Q4_1_TIED, tied=True, fmt="blocks"),
     dict(fmt="blocks", formats={"Q4_1": "blocks", "Q8_0": "blocks"}, binding="ctypes")),
    ("--engine eager: no note", dict(stored=Q4_1_TIED, tied=True, engine="eager", built=512),
     dict(engine="eager", note=None)),
    ("auto with a build: compiled over the file's blocks, through the operator",
     dict(stored=Q4_1_TIED, tied=True, built=512),
     dict(engine="compiled", fmt="blocks", built=512, binding="operator", serving="compiled batch")),
    ("auto with another version's build: eager, and why", dict(stored=Q4_1_TIED, tied=True, stale=True),
     dict(engine="eager", note="built by another llamablock or torch", serving="batch")),
    ("compiled without a kernel: the packed majority", dict(stored=Q4_1_TIED, tied=True, engine="compiled",
                                                            kernel=False),
     dict(engine="compiled", fmt="q4", formats={"Q4_1": "q4", "Q8_0": "q4"}, binding=None)),
    ("compiled on a mixed file: the majority format", dict(stored=Q5_MAJORITY, engine="compiled"),
     dict(engine="compiled", fmt="q8", activations="bfloat16", head="q8")),
    ("AMX: the packed GEMM from 32 rows", dict(stored=Q4_K_M, cpu="AMX", kernel=False),
     dict(prefill={"q8": 32, "q4": 32, "blocks": None})),
    ("a CPU not measured: the blocks' float GEMM from 32 rows", dict(stored=Q4_1_TIED, cpu="other"),
     dict(prefill={"q8": 32, "q4": 32, "blocks": 32})),
    ("flags changed the context or RoPE scaling, built with them: compiled (the name: test below)",
     dict(stored=Q4_1_TIED, tied=True, built=512, rescaled=True),
     dict(engine="compiled", built=512, binding="operator", serving="compiled batch")),
    ("flags changed the scaling, nothing built: eager, and why", dict(stored=Q4_1_TIED, tied=True, rescaled=True),
     dict(engine="eager", note="no compiled build for the context and RoPE scaling these flags set")),
    ("flags set a length-dependent scaling: eager despite a build, and why",
     dict(stored=Q4_1_TIED, tied=True, built=512, rescaled=True, scaling="dynamic"),
     dict(engine="eager", built=None, note="cannot follow a length-dependent RoPE scaling")),
    ("a model's own length-dependent scaling, no flags: eager despite a build, and why",
     dict(stored=Q4_1_TIED, tied=True, built=512, scaling="dynamic"),
     dict(engine="eager", built=None, note="cannot follow a length-dependent RoPE scaling")),
    ("flags changed the scaling, --engine eager: no note", dict(stored=Q4_1_TIED, engine="eager", built=512,
                                                               rescaled=True), dict(engine="eager", note=None)),
    ("flags changed the scaling off the CPU: eager as before", dict(stored=Q4_1_TIED, device="cuda", rescaled=True),
     dict(engine="eager", binding=None)),
    # The KV cache (plan.kv_dtype): the CPU's 16-bit type for quantized weights with float32 activations.
    ("KV cache: blocks on AMX in bfloat16", dict(stored=Q4_1_TIED, tied=True, cpu="AMX"), dict(kv="bfloat16")),
    ("KV cache: blocks on AVX-512 BF16 in bfloat16", dict(stored=Q4_K_M, cpu="AVX-512 BF16"), dict(kv="bfloat16")),
    ("KV cache: blocks on AVX-512 without BF16 in float16", dict(stored=Q4_1_TIED, tied=True), dict(kv="float16")),
    ("KV cache: blocks on AVX2 in float16", dict(stored=Q4_1_TIED, tied=True, cpu="AVX2"), dict(kv="float16")),
    ("KV cache: an AMX CPU dispatched as AVX2 is an AVX2 one", dict(stored=Q4_1_TIED, cpu="AMX as AVX2"),
     dict(kv="float16")),
    ("KV cache: no vector conversion known, float32", dict(stored=Q4_1_TIED, tied=True, cpu="other"),
     dict(kv="float32")),
    ("KV cache: a float32 model keeps float32", dict(stored=F32_ONLY, cpu="AMX"), dict(kv="float32")),
    ("KV cache: a float32 directory keeps float32", dict(stored={"*": "float32"}, kind="transformers", cpu="AMX"),
     dict(kv="float32")),
    ("KV cache: bfloat16 activations (q8) keep theirs on AVX2", dict(stored=Q4_1_TIED, fmt="q8", cpu="AVX2"),
     dict(kv="bfloat16")),
    ("KV cache: --kv-dtype float32 on blocks", dict(stored=Q4_1_TIED, kv="float32", cpu="AMX"), dict(kv="float32")),
    ("KV cache: --kv-dtype float16 on AMX", dict(stored=Q4_1_TIED, kv="float16", cpu="AMX"), dict(kv="float16")),
    ("KV cache: off the CPU, the activations'", dict(stored=Q4_1_TIED, device="cuda", cpu="AMX"), dict(kv="bfloat16")),
    ("KV cache: the compiled engine over blocks", dict(stored=Q4_1_TIED, built=512, cpu="AMX"),
     dict(engine="compiled", kv="bfloat16")),
    ("KV cache: the compiled engine in float32", dict(stored=F32_ONLY, engine="compiled", cpu="AMX"),
     dict(engine="compiled", fmt="float32", kv="float32")),
    # Eager decode steps read a 16-bit cache in place (cache_reader) where the kernel built and q is float32.
    ("cache reader: blocks with a float16 cache", dict(stored=Q4_K_M, cpu="AVX2"), dict(kv="float16", cache_reader=True)),
    ("cache reader: --kv-dtype bfloat16 on a float32 model", dict(stored=F32_ONLY, kv="bfloat16"),
     dict(cache_reader=True)),
    ("cache reader: none for a float32 cache", dict(stored=Q4_1_TIED, kv="float32"), dict(cache_reader=False)),
    ("cache reader: none without the kernel", dict(stored=Q4_1_TIED, kernel=False, kv="float16"),
     dict(activations="bfloat16", cache_reader=False)),
    ("cache reader: none under bfloat16 activations", dict(stored=Q4_1_TIED, fmt="q8", cpu="AVX2"),
     dict(kv="bfloat16", cache_reader=False)),
    ("cache reader: none for the compiled engine", dict(stored=Q4_1_TIED, built=512), dict(cache_reader=False)),
    # Eager decode steps run in C where every layer matrix is blocks and activations are float32.
    ("C step: Q4_K_M as stored", dict(stored=Q4_K_M, cpu="AVX2"), dict(engine="eager", c_step=True)),
    ("C step: a float32 cache too", dict(stored=Q4_1_TIED, tied=True, kv="float32"), dict(c_step=True)),
    ("C step: none without the kernel", dict(stored=Q4_1_TIED, kernel=False), dict(c_step=False)),
    ("C step: none when a layer matrix is re-quantized", dict(stored=Q5_MAJORITY), dict(c_step=False)),
    ("C step: none for --dtype q8", dict(stored=Q4_1_TIED, fmt="q8"), dict(c_step=False)),
    ("C step: none for an all-F32 file (no blocks)", dict(stored=F32_ONLY), dict(c_step=False)),
    ("C step: none for the compiled engine", dict(stored=Q4_1_TIED, built=512), dict(c_step=False)),
]


@pytest.mark.parametrize("row, given, want", TABLE, ids=[r[0] for r in TABLE])
def test_the_plan_table(row, given, want, monkeypatch):
    plan = _plan(**given, monkeypatch=monkeypatch)
    for key, value in want.items():
        if key == "reason":
            assert any(value in why for why in plan.reasons), plan.reasons
        elif key == "note" and value is not None:
            assert value in (plan.note or ""), plan.note
        else:
            assert getattr(plan, key) == value, f"{row}: {key} is {getattr(plan, key)!r}, not {value!r}"


@pytest.mark.parametrize("given, message", [
    (dict(stored=Q4_1_TIED, device="cuda", engine="compiled"), "the compiled engine runs on the CPU"),
    (dict(stored=Q4_1_TIED, device="cuda", fmt="q8"), "--dtype q8 runs on the CPU only"),
    (dict(stored=Q4_1_TIED, fmt="blocks", kernel=False), re.escape(f"the block kernel is not available here ({NO_CC})")),
    (dict(stored={"*": "float32"}, kind="transformers", fmt="blocks"), "is not a GGUF file"),
    (dict(stored=Q5_MAJORITY, fmt="blocks"), "its layer matrices are Q4_0, Q5_1"),
    (dict(stored=Q4_1_TIED, engine="fast"), "--engine must be one of auto, eager, compiled"),
    (dict(stored=Q4_1_TIED, fmt="int3"), "--dtype must be one of auto"),
    (dict(stored=Q4_1_TIED, kv="f8"), "--kv-dtype must be one of auto, float32, bfloat16, float16, got 'f8'"),
    (dict(stored=Q4_1_TIED, kv="f8", device="cuda"), "--kv-dtype must be one of"),
    (dict(stored=Q4_1_TIED, engine="compiled", built=512, rescaled=True, scaling="dynamic"),
     "--rope-scaling dynamic changes RoPE's frequencies with the length"),
    (dict(stored=Q4_1_TIED, engine="compiled", scaling="dynamic-consistent"),
     "the model's own RoPE scaling dynamic-consistent changes RoPE's frequencies with the length"),
])
def test_a_plan_that_cannot_run_is_refused_before_loading(given, message, monkeypatch):
    with pytest.raises(ValueError, match=message):
        _plan(**given, monkeypatch=monkeypatch)


def test_describe_says_every_choice(monkeypatch):
    plan = _plan({**Q5_MAJORITY, "output.weight": "Q6_K"}, monkeypatch=monkeypatch)
    text = plan.describe()
    for part in ("plan: eager engine on cpu", "Q4_0 -> blocks", "Q5_1 -> q8", "output head blocks", "activations bfloat16",
                 "the block kernel through ctypes, Q4_0, Q6_K, Q8_0 rows in groups of 8", "context: 512 tokens",
                 "RoPE scaling none",
                 "q8 dequantizes from 64 rows", "blocks never dequantizes", "batch engine", "llamablock compile", "kind AVX-512", "header: ",
                 "KV cache bfloat16", "16-bit KV cache: float16"):
        assert part in text, (part, text)
    assert "read in place" in _plan(Q4_K_M, monkeypatch=monkeypatch).describe()  # float32 activations, float16 cache


def test_a_build_is_found_under_its_kv_dtype(monkeypatch):
    """The builds index names a build by format and kv dtype (builds.build_name): a build with a float32
    cache is not the bfloat16 plan's, and a cache in the activations' dtype keeps the format's own name."""
    def plan(recorded: str, kv: str = "auto"):
        _plan(Q4_1_TIED, monkeypatch=monkeypatch)  # the other look-ups
        monkeypatch.setattr(builds, "any_build", lambda path: True)
        monkeypatch.setattr(builds, "built_length", lambda path, f, batch=1: 512 if f == recorded else None)
        return decide(_source(Q4_1_TIED), machine=machine_for(CPUS["AMX"], True), kv=kv)

    assert plan("blocks kv bfloat16").built == 512
    assert plan("blocks").engine == "eager" and plan("blocks", kv="float32").built == 512
    assert builds.build_name("q8", "bfloat16", "bfloat16") == "q8"


def test_a_rescaled_model_s_build_is_found_under_its_scaling_only(monkeypatch):
    """A build for the context and RoPE scaling of the flags is recorded under them (builds.scaled_name,
    as `llamablock compile` with those flags records it): the model's own build does not serve the
    rescaled run, nor a build of another scaling."""
    yarn = _source(Q4_1_TIED, scaling="yarn")
    linear = _source(Q4_1_TIED, scaling="linear")
    own = builds.build_name("blocks", "bfloat16", "float32")

    def plan(recorded: str, source):
        _plan(Q4_1_TIED, monkeypatch=monkeypatch)  # the other look-ups
        monkeypatch.setattr(builds, "any_build", lambda path: True)
        monkeypatch.setattr(builds, "built_length", lambda path, f, batch=1: 512 if f == recorded else None)
        return decide(source, machine=machine_for(CPUS["AMX"], True), rescaled=True)

    scaled = builds.build_name("blocks", "bfloat16", "float32", builds.scaled_name(yarn.cfg))
    assert plan(scaled, yarn).engine == "compiled" and plan(scaled, yarn).scaled == builds.scaled_name(yarn.cfg)
    assert plan(own, yarn).engine == "eager" and plan(scaled, linear).engine == "eager"
    assert '"rope_type": "yarn"' in scaled and "ctx 1024" in scaled


def test_the_binding_the_plan_chose_is_the_one_a_layer_calls(tmp_path):
    """Eager layers call the ctypes kernel and a compiled engine's the operator, whatever else the
    process has loaded: loading the operator first does not change an eager layer. Either is handed
    the machine's crossover to the float GEMM (Machine.prefill's blocks)."""
    from gguf_tiny import write_tiny_gguf
    from hf_reference import tiny_hf_model

    from llamablock.fast.kernels import block_op, ggml_kernel
    from llamablock.fast.kernels.file_blocks import BlockLinear
    from llamablock.fast.plan import load_gguf_native

    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16),
                    qtype="Q8_0")
    if ggml_kernel.kernel() is None:
        pytest.skip(f"the block kernel does not build here ({ggml_kernel.why_not()})")
    operator = block_op.load()
    eager, _ = load_gguf_native(f)
    layers = [m for m in eager.modules() if isinstance(m, BlockLinear)]
    crossover = {"gemm_from": this_machine().prefill["blocks"]}
    assert layers and all(m.binding.func is ggml_kernel.matmul and m.binding.keywords == crossover for m in layers)
    if operator:
        compiled, _ = load_gguf_native(f, engine="compiled")
        assert all(m.binding.func is block_op.linear and m.binding.keywords == crossover
                   for m in compiled.modules() if isinstance(m, BlockLinear))
    calls = []
    for m in layers:  # every layer multiplies through its own binding, and nothing else
        m.binding = lambda *a, real=m.binding, **k: calls.append(a[0]) or real(*a, **k)
    eager(torch.tensor([[1, 2, 3]]))
    # an untied embedding's own blocks (BlockEmbedding.rows) are read row by row, never multiplied
    assert len(calls) == len([m for m in layers if m is not getattr(eager.embed, "rows", None)])
