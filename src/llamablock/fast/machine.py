"""What this process can run, recorded once: the facts about the machine that the plan decides from.

The same command runs on very different CPUs, and on one where no C compiler works. Every choice
that depends on that (which stored GGUF types run as the file's own blocks, whether a layer holds
its blocks in groups of 8 rows, from how many prompt rows a packed or block layer dequantizes for a GEMM)
is read from one `Machine`, made once per process by `this_machine()`, and only `decide`
(fast/plan.py) reads it: layers are handed what they need when they are built, so nothing below
the plan reads process-wide state. A test builds a Machine by hand to simulate another CPU
(tests/fast/test_plan.py).

    cpu          util/cpu.py's record (name, cores, ATen's dispatch ISA, features, kind)
    kernel       whether the block kernel (fast/kernels/ggml_kernel.py) built here, and `why_not`
    kernel_isa   the kernel's build for this CPU: "avx512vnni", "avx512", "avx2" or "portable"
    grouped      whether layers hold blocks in groups of 8 rows (that build is faster so)
    prefill      {q8, q4, blocks: rows from which a packed layer (quant.prefill_rows) or a block layer
                 (ggml_kernel.gemm_rows) dequantizes for a GEMM (None: never)}
    kv16         the 16-bit type a KV cache is kept in here (`kv16_for`), or "float32" where none is
The block operator that compiled programs call is not probed here: building it takes the C++
compiler several seconds, so the compiled engine builds it when it runs (fast/kernels/block_op.py).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.kernels.quant import prefill_rows
from llamablock.util.cpu import CPU, this_cpu


@dataclass(frozen=True)
class Machine:
    cpu: CPU
    kernel: bool
    kernel_isa: str
    grouped: bool
    prefill: dict = field(default_factory=dict)  # {"q8", "q4", "blocks": rows or None}
    why_not: str = ""  # why the kernel did not build ("" where it did)
    kv16: str = "float32"  # the 16-bit KV cache type of this CPU (kv16_for)

    @property
    def kept(self) -> frozenset[str]:
        """The GGUF types whose blocks run as stored (ggml_kernel.KEPT where the kernel built, else none)."""
        return frozenset(ggml_kernel.BLOCK_BYTES) if self.kernel else frozenset()

    def without_kernel(self, why: str) -> Machine:
        """This machine as one where the block kernel did not build, for `why` (tests simulate it)."""
        return dataclasses.replace(self, kernel=False, grouped=False, why_not=why)

    def describe(self) -> str:
        kernel = (f"block kernel: its {self.kernel_isa} build" + (", rows in groups of 8" if self.grouped else "")
                  if self.kernel else f"no block kernel ({self.why_not})")
        crossover = ", ".join(f"{f} from {r} rows" if r is not None else f"{f} never" for f, r in self.prefill.items())
        return (f"{self.cpu.describe()}; kind {self.cpu.kind}; {kernel}; prefill GEMM: {crossover}; "
                f"16-bit KV cache: {self.kv16 if self.kv16 != 'float32' else 'none'}")


def kv16_for(cpu: CPU) -> str:
    """The 16-bit type this CPU keeps a KV cache in: bfloat16 where its kernels convert it in
    hardware (AVX-512 BF16, AMX: vcvtneps2bf16 writes it; bfloat16 keeps float32's range, so no key
    overflows), float16 on the other AVX2/AVX-512 and NEON CPUs (every AVX2 CPU has F16C's
    conversions, Arm's NEON converts float16 in one instruction; float16 keeps 11 significant bits
    to bfloat16's 8, its largest value 65504), else "float32" (no vector conversion known). The
    kind, not the flags alone: a dispatch lowered to AVX2 behaves as an AVX2 CPU (util/cpu.py)."""
    if cpu.kind == "AMX" or (cpu.kind == "AVX-512" and "avx512_bf16" in cpu.features):
        return "bfloat16"
    return "float16" if cpu.kind in ("AVX-512", "AVX2", "NEON") else "float32"


def machine_for(cpu: CPU, kernel: bool, why_not: str = "", isa: str | None = None) -> Machine:
    """The record for `cpu` with the block kernel built or not: what this_machine() derives, and
    what tests call to simulate another machine. `isa` the kernel's build (default: the widest
    `cpu` runs, by its dispatch kind)."""
    if isa is None:
        vnni = "avx512vnni" if "avx512_vnni" in cpu.features else "avx512"
        isa = vnni if cpu.kind in ("AMX", "AVX-512") else "avx2" if cpu.kind == "AVX2" else "portable"
    return Machine(cpu, kernel, isa, kernel and isa in ggml_kernel.GROUPING_ISAS,
                   {**{f: prefill_rows(f, cpu.kind) for f in ("q8", "q4")}, "blocks": ggml_kernel.gemm_rows(cpu.kind)},
                   "" if kernel else why_not, kv16_for(cpu))


@functools.cache
def this_machine() -> Machine:
    """This process's machine, built once (the block kernel is compiled here on first use, well
    under a second, and kept in the user's cache)."""
    built = ggml_kernel.kernel() is not None
    return machine_for(this_cpu(), built, ggml_kernel.why_not(), ggml_kernel.best_isa())
