"""The default thread count: the physical cores this process may run on (util/threads.py), read from
a sysfs topology that the test writes, so SMT and its absence are both checked on any machine."""

from __future__ import annotations

import os

from llamablock.util.threads import available_cores, physical_cores


def _topology(root, cores_of):
    """cpuN/topology with (package, core) ids: cores_of[N] for every CPU N this process may use."""
    for cpu in sorted(os.sched_getaffinity(0)):
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        package, core = cores_of(cpu)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
    return root


def test_smt_siblings_count_once(tmp_path):
    n = available_cores()
    assert physical_cores(_topology(tmp_path, lambda cpu: (0, cpu // 2))) == len({c // 2 for c in os.sched_getaffinity(0)})
    assert physical_cores(_topology(tmp_path / "noSMT", lambda cpu: (0, cpu))) == n


def test_two_packages_with_the_same_core_ids_are_two_cores(tmp_path):
    assert physical_cores(_topology(tmp_path, lambda cpu: (cpu, 0))) == available_cores()


def test_without_a_topology_the_available_cpus(tmp_path):
    assert physical_cores(tmp_path / "absent") == available_cores()
