"""What this CPU can do, read once: the vector extensions that decide which kernels are fast here.

The same command runs on very different CPUs: a Xeon with AMX multiplies bfloat16 matrices in
hardware, an AVX-512 CPU has inductor's C++ GEMM templates for the packed int4 matmul, and an
AVX2-only laptop has neither (inductor then has no template at all for int4:
llamablock.fast.compiled.build_options says what the compiled engine does about it). The features come
from torch's own cpuinfo (`torch.cpu.get_capabilities`), and the vector width from the ISA that
ATen dispatches to (`torch.backends.cpu.get_cpu_capability`), which inductor follows too: setting
ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine makes both behave as on an AVX2 one, so `kind`
reads that rather than the flags alone.

    this_cpu().kind        "AMX", "AVX-512", "AVX2", "NEON" or "other"
    this_cpu().describe()  "AMD EPYC, 2 cores: AVX2, AVX-512, AVX-512 BF16, AVX-512 VNNI (kernels: AVX512)"
`llamablock bench` prints it in BENCHMARKS.md's header and `llamablock generate --verbose` on stderr.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

# torch's cpuinfo key -> the name people know it by, in the order printed
FEATURES = {"avx2": "AVX2", "avx_vnni": "AVX-VNNI", "avx512_f": "AVX-512", "avx512_bf16": "AVX-512 BF16",
            "avx512_vnni": "AVX-512 VNNI", "amx_bf16": "AMX BF16", "amx_int8": "AMX INT8", "neon": "NEON"}
KINDS = ("AMX", "AVX-512", "AVX2", "NEON", "other")


@dataclass(frozen=True)
class CPU:
    name: str
    cores: int
    isa: str  # what ATen's kernels dispatch to: "AVX512", "AVX2", "DEFAULT", ... (ATEN_CPU_CAPABILITY lowers it)
    features: frozenset[str]  # keys of FEATURES that the CPU reports

    @property
    def kind(self) -> str:
        """The class of CPU that the kernel choices depend on: AMX needs AVX-512 kernels to reach it,
        so a dispatch lowered to AVX2 makes an AMX machine an AVX2 one."""
        if self.isa.startswith("AVX512"):
            return "AMX" if "amx_bf16" in self.features else "AVX-512"
        if self.isa.startswith("AVX2"):
            return "AVX2"
        return "NEON" if "neon" in self.features else "other"

    def describe(self) -> str:
        named = [label for key, label in FEATURES.items() if key in self.features]
        return f"{self.name}, {self.cores} cores: {', '.join(named) or 'no vector extension known here'} (kernels: {self.isa})"


def cpu_from(caps: dict, isa: str) -> CPU:
    """A CPU from torch's capability table and ATen's dispatch ISA (separate for tests that simulate one)."""
    features = frozenset(k for k in FEATURES if caps.get(k))
    if caps.get("architecture") == "aarch64" and "neon" not in features:
        features |= {"neon"}  # every 64-bit Arm core has Advanced SIMD; cpuinfo does not list it
    name = str(caps.get("cpu_name") or caps.get("architecture") or "unknown CPU")
    return CPU(name, int(caps.get("num_logical_cores") or os.cpu_count() or 1), isa, features)


@functools.cache
def this_cpu() -> CPU:
    """This machine's CPU, read once per process."""
    import torch

    try:
        caps = torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):  # a torch without cpuinfo's table
        caps = {}
    return cpu_from(caps, torch.backends.cpu.get_cpu_capability())
