"""The CPU's kind from torch's capability table and ATen's dispatch ISA, each kind simulated.

Reference: the kinds' definitions in llamablock.util.cpu (AMX needs AVX-512 dispatch to be used;
ATEN_CPU_CAPABILITY=avx2 makes any x86 CPU an AVX2 one for ATen and inductor alike)."""

import pytest

from llamablock.util.cpu import cpu_from, this_cpu

XEON = {"cpu_name": "Intel Xeon", "num_logical_cores": 2, "avx2": True, "avx512_f": True, "avx512_bf16": True,
        "avx512_vnni": True, "amx_bf16": True, "amx_int8": True, "architecture": "x86_64"}
EPYC_AVX2 = {"cpu_name": "AMD EPYC", "num_logical_cores": 2, "avx2": True, "architecture": "x86_64"}


@pytest.mark.parametrize("caps, isa, kind", [
    (XEON, "AVX512", "AMX"),
    (XEON, "AVX2", "AVX2"),  # dispatch lowered: AMX's kernels are AVX-512 ones
    ({**XEON, "amx_bf16": False, "amx_int8": False}, "AVX512", "AVX-512"),
    (EPYC_AVX2, "AVX2", "AVX2"),
    ({"architecture": "aarch64", "cpu_name": "Apple M2"}, "DEFAULT", "NEON"),
    ({"architecture": "x86_64"}, "DEFAULT", "other"),
])
def test_kind(caps, isa, kind):
    assert cpu_from(caps, isa).kind == kind


def test_describe_names_the_features_and_the_dispatch():
    text = cpu_from(XEON, "AVX512").describe()
    assert text == ("Intel Xeon, 2 cores: AVX2, AVX-512, AVX-512 BF16, AVX-512 VNNI, AMX BF16, AMX INT8 "
                    "(kernels: AVX512)")
    assert "AVX-512" not in cpu_from(EPYC_AVX2, "AVX2").describe()


def test_this_cpu_is_read_once():
    assert this_cpu() is this_cpu() and this_cpu().kind in ("AMX", "AVX-512", "AVX2", "NEON", "other")
