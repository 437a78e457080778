"""The inductor settings of the compiled engines, and what to try when one cannot build on this CPU.

    inductor_options(autotune)   freezing (weights become constants, prepacked for the CPU's GEMMs)
                                 and, with `autotune`, max-autotune restricted to the C++ GEMM templates
    step_options / prefill_options   per-program adjustments (each docstring says why)
    attempts(fmt, method, autotune)  the settings to try in order: the fast ones first, then ones
                                 with fewer preconditions, each with a name the summary line prints

Why a list: the C++ GEMM templates exist only for some CPUs. On an AVX2 CPU without AVX-512 there
is no template for the int4 matmul, and a max-autotune restricted to the templates ends in
inductor's NoValidChoicesError ("No choices exist for backend"); ATen beside the templates always
offers its own kernel, and inductor's defaults choose no GEMM at all. The compiled engine
(llamablock.fast.compiled.aoti_engine.AOTIEngine) tries each in turn and, when all fail, runs the same
static layout eagerly; `tests/fast/kernels/test_build_fallback.py` simulates the missing template.
"""

from __future__ import annotations

from typing import NamedTuple

REALIZE_OPS = 8  # the decode step's realize_opcount_threshold (step_options says why)


def inductor_options(autotune: bool, extra: dict | None = None) -> dict:
    """The inductor settings of both compiled engines: freezing, and with `autotune` the C++ GEMM templates."""
    options = {"freezing": True}
    if autotune:
        options.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP"})
    return {**options, **(extra or {})}


def prefill_options(options: dict) -> dict:
    """The prefill's settings: with autotuning, ATen's GEMMs (oneDNN, MKL) compete with the C++
    templates, since its matmuls have t rows, not one. The templates are tuned for a length of L / 2."""
    if options.get("max_autotune"):
        return {**options, "max_autotune_gemm_backends": "CPP,ATEN"}
    return options


def step_options(fmt: str, options: dict) -> dict:
    """The decode step's settings, chosen by side-by-side runs of SmolLM2's step (`llamablock bench decode`).

    float32 with autotuning: MKL's matrix-vector product (aten.mm on the weights as they are,
    `cpp.weight_prepack` off) in place of the C++ templates, which stream float32 weights slower at
    one row. The other formats keep the templates, which fuse the int8/int4 scales into the matmul.
    Every format, with autotuning: inductor keeps a pointwise result as a buffer once it takes more
    than REALIZE_OPS ops (`realize_opcount_threshold`, default 30) instead of recomputing it where it
    is read; with the default, the attention kernel recomputed q's RoPE for every cached key inside
    the scores' reduction. The useful window is narrow: a change to the step's RoPE expression
    should measure it again (the generated attention kernel shows whether q is loaded or recomputed
    inside the loop over cached keys)."""
    if not options.get("max_autotune"):
        return options
    options = {**options, "realize_opcount_threshold": REALIZE_OPS}
    if fmt == "float32":
        kept = {k: v for k, v in options.items() if not k.startswith("max_autotune")}
        return {**kept, "cpp.weight_prepack": False}
    return options


# torch 2.13's inductor writes its int4 micro-GEMMs for AVX-512 and AMX only
# (torch/_inductor/codegen/cpp_micro_gemm.py: CppMicroGemmWoQInt4Avx512, CppMicroGemmWoQInt4Amx)
INT4_TEMPLATE_KINDS = ("AVX-512", "AMX")


class Attempt(NamedTuple):
    name: str  # what the engine's summary and its fallback line call it
    options: dict  # inductor settings; part of the package's key, so each attempt has its own package
    why: str = ""  # why this CPU starts here rather than at the templates, for the summary line


def attempts(fmt: str, method: str, autotune: bool = True, extra: dict | None = None,
             cpu_kind: str | None = None) -> list[Attempt]:
    """The settings for program `method` ("step" or "prefill") in `fmt`, in the order to try them.

    With `autotune`: the tuned settings above, then max-autotune with ATen's GEMMs beside the
    templates (a choice exists on every CPU), then inductor's defaults; without: the defaults alone.
    Chosen per CPU (`cpu_kind`, default this one's: llamablock.util.cpu): q4 on a CPU without
    inductor's int4 templates starts at ATen's GEMMs, since the templates-only settings can only
    fail there. Attempts whose settings equal an earlier one's are dropped (the float32 step
    already leaves the templates for MKL)."""
    if cpu_kind is None:
        from llamablock.util.cpu import this_cpu

        cpu_kind = this_cpu().kind
    adjust = (lambda o: step_options(fmt, o)) if method == "step" else prefill_options
    found: list[Attempt] = []
    if autotune:
        tuned = inductor_options(True, extra)
        with_aten = adjust({**tuned, "max_autotune_gemm_backends": "CPP,ATEN"})
        if fmt == "q4" and cpu_kind not in INT4_TEMPLATE_KINDS:
            found.append(Attempt("autotuned, ATen's GEMMs beside the templates", with_aten,
                                 f"inductor's int4 templates need AVX-512 or AMX; this CPU's kernels are {cpu_kind}"))
        else:
            found.append(Attempt("autotuned C++ GEMM templates", adjust(tuned)))
            found.append(Attempt("autotuned, ATen's GEMMs beside the templates", with_aten))
    found.append(Attempt("inductor's default kernels", inductor_options(False, extra)))
    unique: list[Attempt] = []
    for a in found:
        if all(a.options != u.options for u in unique):
            unique.append(a)
    return unique
