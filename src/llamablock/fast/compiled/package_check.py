"""Checking an AOTInductor package in the cache before it is loaded (fast/compiled/aoti_step.py).

A package's shared library cut short (a full disk, a process killed while unpacking) is mapped past
its end when it is loaded, and the first step dies of SIGBUS with no message; another file in its
place ends in a traceback. So, as for the kernel libraries (fast/kernels/build.py, whose records and
checks these are), each file that a load maps (the package's shared libraries, and its weights where
it keeps them as files) gets a record of its size and sha256 when the package is written, and each
one's size is checked against it before the package is loaded (a cut-short file is the case that
faults; reading the weights through to hash them would cost every warm start), and each library's
first bytes (garbage of the right size is not a shared library). A package with a damaged or
unrecorded shared library has that library set aside (one line on stderr), which makes the package absent: it is
compiled again. A package in a read-only cache whose files check out is loaded as it is.

A compile builds its package in a staging folder beside the packages (`.<key>.<pid>`, aoti_step) and
renames it into place when whole; a compile killed before that leaves the folder, weights and all.
Those of processes that are gone are removed by the next process that loads or compiles a package
(`remove_stale_staging`) and by `llamablock cache --clear`; those of running compiles are left.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from pathlib import Path

from llamablock.fast.kernels.build import damage, record, record_file, set_aside
from llamablock.util.files import process_alive

WHAT = "compiled program's library"  # the line on stderr: "the compiled program's library <path> is damaged"


def mapped_files(package: Path) -> list[Path]:
    """The files of the unpacked `package` that loading it maps: its shared libraries, and its weights
    or constants where the package keeps them as separate files."""
    found = [*package.glob("*/data/aotinductor/model/*.so"), *package.glob("*/data/weights/*"),
             *package.glob("*/data/constants/*")]
    return sorted(p for p in found if p.is_file() and not p.name.endswith(".sha256"))


def record_package(package: Path) -> None:
    """Write the record of each mapped file of `package` (before it is renamed into place, so that a
    reader never finds a package without its records)."""
    for path in mapped_files(package):
        record(path)


def damaged_package(package: Path) -> tuple[Path, str] | None:
    """The first mapped file of `package` that must not be loaded and why (cut short, changed, or with
    no record), or None when every one agrees with its record."""
    for path in mapped_files(package):
        why = damage(path, digest=False)  # size alone: the weights are inside it, and hashing them costs every start
        if why is None and path.suffix == ".so":
            why = _not_elf(path)
        if why is not None:
            return path, why
    return None


def _not_elf(library: Path) -> str | None:
    """Why `library` is not a shared library by its first bytes (garbage of the right size, which the
    size check cannot see and the loader refuses with a traceback); None on a system without ELF."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(library, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    return None if head == b"\x7fELF" else "it is not a shared library (its first bytes are not ELF's)"


def unusable(package: Path) -> str | None:
    """Why the unpacked `package` cannot be loaded as it is (a file damaged or unrecorded, or its
    library set aside as damaged), for the builds index to say; None for one that can (or that has
    no library yet: compiled on first use)."""
    found = damaged_package(package)
    if found is not None:
        return f"{found[0]}: {found[1]}"
    aside = sorted(package.glob("*/data/aotinductor/model/*.so.damaged"))
    if aside and not list(package.glob("*/data/aotinductor/model/*.so")):
        return f"{aside[0]} was set aside as damaged"
    return None


def set_aside_package(package: Path) -> str | None:
    """Check `package`; where a file of it is damaged, move that file aside (build.set_aside: one line
    on stderr), which leaves the package without it, so it is compiled again. Returns None when the
    package can be loaded or was set aside, else why it can be neither (damaged in a cache that
    cannot be written)."""
    found = damaged_package(package)
    if found is None:
        return None
    path, why = found
    if not set_aside(path, why, what=WHAT, again="compiling it again"):
        return f"{path} is damaged ({why}) and cannot be moved aside"
    for library in package.glob("*/data/aotinductor/model/*.so"):  # a weights file was: absent all the same
        with contextlib.suppress(OSError):
            os.replace(library, library.with_name(library.name + ".damaged"))
            record_file(library).unlink(missing_ok=True)
    return None


# a compile's staging folder, `.<package key>.<pid>`, or an index written atomically, `.<name>.<pid>.tmp`
_STAGING = re.compile(r"\.(?:[0-9a-f]{32}\.(\d+)|.+\.(\d+)\.tmp)")


def staging(packages: Path) -> list[tuple[Path, bool]]:
    """The staging folders (and half-written files) in the package directory, each with whether the
    process that writes it is still running."""
    found = [(p, _STAGING.fullmatch(p.name)) for p in packages.iterdir()] if packages.is_dir() else []
    return [(p, process_alive(int(m.group(1) or m.group(2)))) for p, m in found if m]


def remove_stale_staging(packages: Path) -> list[Path]:
    """Remove the staging folders in `packages` left by processes that are gone; return them. Never
    fails: a read-only cache keeps them."""
    removed = []
    for path, alive in staging(packages):
        if not alive:
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                removed.append(path)
    return removed
