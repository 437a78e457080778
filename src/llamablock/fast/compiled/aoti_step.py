"""The static decode step and prefill compiled ahead of time by AOTInductor, cached on disk.

torch.compile re-traces the step in every new process (dynamo, AOTAutograd, freezing), even
with a warm cache, and launches its kernels from Python at every step, behind dynamo's guards.
AOTInductor compiles an exported program into a shared library with a C++ launcher; a later
process loads that library instead, and each step runs without the Python launcher and the
guards (`llamablock bench decode` and `llamablock bench compile_cache` measure the step and
the start-up). Tests check the library's logits against the eager step (1e-4, float32).

    step = AOTIProgram(static, fmt, options, "step", (ids, pos))   # static: a StaticDecoder
    logits = step(ids, pos)                     # writes the step's key/value into static's cache
    prefill = AOTIProgram(static, fmt, options, "prefill", (ids_t, last), lengths=(32, 1023))
    logits = prefill(ids, last)                 # any prompt length t in 32..1023 (t symbolic)

Export: `torch.export` of `static.step` with the static cache's per-layer tensors as inputs that
the program writes in place (the cache is a plain attribute of the StaticDecoder, not module
state, which export would refuse to alias with inputs); the eager prefill writes the same tensors. Weights become constants of the library (freezing; over a file's blocks they are handed in at load,
SHARED_WEIGHT_FORMATS), so it is only valid
for these exact weights: it is named by a hash of the static layout's state (weights and
quantized buffers), the config, format, cache length, inductor options and the torch version.

Cache layout: `<inductor cache dir>/llamablock-aoti/<hash>/`, the .pt2 package that
`aoti_compile_and_package` writes, unpacked once (a staging folder `.<hash>.<pid>`, then a rename:
a reader never sees half a package; one a killed compile left is removed by the next process that
loads or compiles: package_check.remove_stale_staging). Each library in it has a record of its
size and sha256, checked before each load: a package cut short or changed is set aside and
compiled again, never loaded
(fast/compiled/package_check.py). After each compile the least recently used packages are
deleted beyond MAX_CACHE_BYTES (`prune`), and AOTInductor's build copy of the new library is
deleted from inductor's cache (`drop_build_copy`). Why unpacked: `aoti_load_package` unpacks the
archive into a temporary directory on every load, which is most of its load time since the
library carries the weights (hundreds of MB for SmolLM2), while the same library loads from a
directory with no copy. The library is run through
`torch._C._aoti.AOTIModelContainerRunnerCpu`, the runner that the package loader and
`torch._export.aot_load` wrap, given the flat list of input tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time
import zipfile
from pathlib import Path

import torch
from torch import nn

from llamablock.fast.compiled.huge_pages import collapse, tensor_ranges
from llamablock.fast.compiled.package_check import record_package, remove_stale_staging, set_aside_package
from llamablock.util.files import atomic_write


class _WithCacheInputs(nn.Module):
    """static.<method>(*args, k0, v0, k1, v1, ...) -> logits: the cache's tensors are inputs, written in place."""

    def __init__(self, static, method: str, n_args: int):
        super().__init__()
        self.static, self.method, self.n_args = static, method, n_args

    def forward(self, *inputs):
        args, caches = inputs[:self.n_args], inputs[self.n_args:]
        cache = self.static.cache
        saved = cache.keys, cache.values
        try:
            cache.keys, cache.values = list(caches[0::2]), list(caches[1::2])
            return getattr(self.static, self.method)(*args)
        finally:  # tracing hands in stand-ins; the cache keeps the real tensors for the eager prefill
            cache.keys, cache.values = saved


def weights_digest(static) -> str:
    """A hash of the static layout's weights and quantized buffers (the caches are not in its
    state_dict: non-persistent). It reads every weight, so it is computed once per layout and
    shared by its programs."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(static.state_dict().items()):
        h.update(name.encode())
        h.update(str(tensor.dtype).encode())
        h.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def weights_name(static, weights_id: str | None = None) -> str:
    """The weights' part of a package's name: a hash of `weights_id`, a string that determines them
    (a model read from a file: fast/compiled/builds.py weights_identity), or else of the weights themselves
    (weights_digest reads every byte, at every start)."""
    if weights_id is None:
        return weights_digest(static)
    return hashlib.blake2b(weights_id.encode(), digest_size=16).hexdigest()


def package_key(static, fmt: str, options: dict, method: str, example: tuple, digest: str | None = None,
                lengths: tuple[int, int] | None = None) -> str:
    """A hash of everything a compiled program depends on: its weights (constants in it), the config, format,
    cache length and dtype (another dtype, another program) and whether the operators read it (`in_place`),
    the function, its input shapes and length range, inductor options, torch, llamablock's source."""
    h = hashlib.blake2b(digest_size=16)
    cfg = json.dumps(dataclasses.asdict(static.cfg), sort_keys=True, default=str)
    opts = json.dumps(options, sort_keys=True, default=str)
    shapes = [tuple(t.shape) for t in example]
    symbolic = "" if lengths is None else f"|lengths {lengths}"
    symbolic += f"|kv {static.cache.keys[0].dtype}" + ("|in place" if static.in_place else "")
    h.update(f"{torch.__version__}|{fmt}|{static.length}|{static.batch}|{method}|{shapes}{symbolic}|{opts}|{cfg}".encode())
    h.update((digest or weights_digest(static)).encode())
    h.update(source_digest().encode())
    return h.hexdigest()


@functools.cache
def source_digest(root: Path = Path(__file__).parents[2]) -> str:
    """A hash of the Python source under `root` (llamablock's own): the code a program was traced
    from. Without it, an edited or upgraded llamablock would load programs compiled from the code
    before. Any edit of the package counts, the cost being a recompile after an edit that did not
    change a program."""
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def package_dir() -> Path:
    """`<inductor cache dir>/llamablock-aoti`. The variable is read here first, as inductor's
    cache_dir() does, because importing inductor just to ask would be a large part of a warm start."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if root is None:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        root = cache_dir()
    return Path(root).absolute() / "llamablock-aoti"


# Formats whose programs carry no weights: they read the static layout's tensors, handed in at load
# (AOTIProgram._share_weights), not a copy each (`llamablock bench size`; test_compiled_memory.py).
# Unfrozen: freezing folds views of the weights into constants the layout lacks (the tied embedding
# regrouped; cos[None]) and over the blocks has nothing to prepack. The float and q8/q4 formats'
# GEMMs prepack their weights while freezing, so those keep theirs inside the library.
SHARED_WEIGHT_FORMATS = ("blocks",)

MAX_CACHE_BYTES = 8 << 30  # the packages kept on disk (each holds its program's weights)


def directory_bytes(directory: Path) -> int:
    """Bytes of the files under `directory` (0 when it does not exist)."""
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) if directory.is_dir() else 0


def prune(directory: Path, keep: Path, max_bytes: int = MAX_CACHE_BYTES) -> list[Path]:
    """Delete the least recently used packages (by modification time, which every load refreshes)
    until `directory` holds at most `max_bytes`; never `keep`, nor a compile in progress (a dot
    name). A process that has a deleted package's library loaded keeps running it (Linux keeps an
    unlinked file while it is mapped). Returns what was deleted."""
    removed = []
    entries = sorted((p.stat().st_mtime, p) for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    sizes = {p: directory_bytes(p) for _, p in entries}
    total = sum(sizes.values())
    for _, p in entries:  # oldest first
        if total <= max_bytes:
            break
        if p != keep:
            shutil.rmtree(p, ignore_errors=True)
            total -= sizes[p]
            removed.append(p)
    return removed


def drop_build_copy(package: Path, root: Path) -> list[Path]:
    """Delete AOTInductor's build copy of the files in the unpacked `package`; return what was deleted.

    aoti_compile_and_package builds the library in `<root>/<hash of the graph's code>/` and copies
    it into the package. Nothing reads or deletes that build copy afterwards (llamablock loads the
    package), so without this the inductor cache holds every program twice, each copy carrying
    the program's weights, and grows without bound. Only files named as the package's own (hashes
    of their source) one level under `root` are deleted, then the wrapper's directory and the
    build directory if that leaves them empty: another compile building in the same directory
    keeps its files."""
    removed = []
    for own in sorted(package.glob("*/data/aotinductor/model/*")):
        for copy in root.glob(f"*/{own.name}"):
            if copy.is_file() and copy.parent != package.parent:
                copy.unlink()
                removed.append(copy)
    for build in {copy.parent for copy in removed}:
        for stem in {copy.name.split(".")[0] for copy in removed if copy.parent == build}:
            _rmdir_if_empty(build / stem)
        _rmdir_if_empty(build)
    return removed


def _rmdir_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:  # not empty (or gone): kept
        pass


def _library(directory: Path) -> Path | None:
    """The compiled shared library inside an unpacked package, or None when there is none."""
    found = sorted(directory.glob("*/data/aotinductor/model/*.so")) if directory.is_dir() else []
    return found[0] if len(found) == 1 else None


class BuildFailed(RuntimeError):
    """A program that inductor could not build with the settings given (the message says why in one
    line); `remembered` when an earlier process failed and left the marker (nothing was compiled now)."""

    def __init__(self, reason: str, remembered: bool = False):
        super().__init__(reason)
        self.remembered = remembered


def failure_marker(package: Path) -> Path:
    """`<package>.failed`, beside where the package would be: written when a compile with these
    settings fails, so that later processes go straight to the next settings instead of spending
    the same minutes failing again. Its name is the package's key, which hashes the weights, the
    settings, torch and llamablock's source: an upgrade or an edit tries again."""
    return package.with_name(package.name + ".failed")


def one_line(error: BaseException, width: int = 200) -> str:
    """The error's type and the first line of its message, for a one-line report."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:width]


class AOTIProgram:
    """One method of a StaticDecoder compiled: `program(*args) -> logits (b, vocab)`, the caches
    passed in behind `args`. method "step": args (ids (b, 1), pos (1,)); "prefill": (ids (b, t),
    last (1,)). `example` gives the argument shapes; `lengths` (min, max) makes the first
    argument's dimension 1 symbolic over that range (the prefill: one program for every prompt
    length; export needs min >= 2). `compile_seconds` is 0 when the library came from the disk cache.
    `huge_pages`: move the library's copy of the weights into 2 MiB pages once loaded
    (llamablock.fast.compiled.huge_pages); `huge_page_bytes` says how much the kernel moved."""

    def __init__(self, static, fmt: str, options: dict, method: str, example: tuple, digest: str | None = None,
                 lengths: tuple[int, int] | None = None, huge_pages: bool = False):
        self.method, self.example, self.lengths = method, example, lengths
        self.caches = static.cache.tensors()
        self.shares_weights = fmt in SHARED_WEIGHT_FORMATS
        if self.shares_weights:
            options = {**options, "freezing": False, "aot_inductor.package_constants_in_so": False}
        self.path = package_dir() / package_key(static, fmt, options, method, example, digest, lengths)
        self.compile_seconds = 0.0
        remove_stale_staging(self.path.parent)  # killed compiles' leftovers, weights and all
        library = _library(self.path)
        if library is not None and (cannot := set_aside_package(self.path)) is not None:
            raise BuildFailed(cannot)  # a read-only cache: never loaded, and nothing remembered
        library = _library(self.path)  # None where a damaged package was set aside: compiled again
        if library is None:
            failed = failure_marker(self.path)
            if failed.is_file():  # tried before with these exact settings, weights, torch and source
                raise BuildFailed(failed.read_text().strip(), remembered=True)
            t = time.perf_counter()
            try:
                self._compile(static, options)
            except (OSError, MemoryError):  # the machine's state, not the settings: nothing remembered
                raise
            except Exception as e:  # inductor's errors have no common base class short of Exception
                reason = one_line(e)
                failed.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(failed, lambda f: f.write_text(reason + "\n"))
                raise BuildFailed(reason) from e
            self.compile_seconds = time.perf_counter() - t
            library = _library(self.path)
            prune(self.path.parent, keep=self.path)
        else:
            with contextlib.suppress(OSError):  # a read-only cache: loaded as it is
                os.utime(self.path)  # recently used: pruned last
        # Linux lets a process use AMX tiles only after it asks (arch_prctl XTILEDATA). Inductor asks
        # while compiling; a process that only loads a library whose GEMMs use AMX (the bfloat16 and
        # int8 prefill on AMX CPUs) dies of SIGILL at its first call without this.
        torch.cpu._init_amx()
        self.runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), 1)
        if self.shares_weights:
            self._share_weights(static)
        self.huge_page_bytes = 0
        if huge_pages:  # the block the library copied its weights into
            self.huge_page_bytes = collapse(tensor_ranges(self.runner.extract_constants_map(False).values()))

    def _share_weights(self, static) -> None:
        """Hand the library `static`'s own tensors as its constants (user-managed: never copied), by
        their path under the wrapper (`static.<path>`); one that is not there (a folded constant) is
        refused, not guessed. The key holds the weights' identity: shapes and dtypes are as traced."""
        own = dict(static.named_parameters(prefix="static"))
        own.update(static.named_buffers(prefix="static"))
        given = {}
        for name, path in self.runner.get_constant_names_to_original_fqns().items():
            tensor = own.get(path)
            if tensor is None:
                raise RuntimeError(f"the compiled {self.method} program wants a constant {path!r} that the static "
                                   "layout does not have; run `llamablock cache --clear builds` and compile again")
            given[name] = tensor
        self.runner.update_constant_buffer(given, False, True, True)  # active buffer, all of them, user-managed

    def _compile(self, static, options: dict) -> None:
        """options: inductor settings (llamablock.fast.compiled.build_options)."""
        import torch._inductor

        wrapper = _WithCacheInputs(static, self.method, len(self.example))
        # Stand-ins for the caches, so that nothing done while compiling (autotuning runs kernels)
        # can touch a prompt already in the real ones: programs are compiled on first use.
        caches = [torch.zeros_like(c) for c in self.caches]
        dynamic = None
        if self.lengths is not None:
            t = torch.export.Dim("t", min=self.lengths[0], max=self.lengths[1])
            dynamic = (({1: t}, *[None] * (len(self.example) - 1 + len(caches))),)  # forward(*inputs)
        program = torch.export.export(wrapper, (*self.example, *caches), dynamic_shapes=dynamic, strict=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            package = tmp / "package.pt2"
            # a copy: aoti_compile_and_package adds keys to the dict it is given
            torch._inductor.aoti_compile_and_package(program, package_path=str(package), inductor_configs=dict(options))
            with zipfile.ZipFile(package) as archive:
                archive.extractall(tmp)
            package.unlink()
            if _library(tmp) is None:
                raise RuntimeError(f"AOTInductor's package has no single shared library under {tmp}")
            drop_build_copy(tmp, self.path.parent.parent)
            record_package(tmp)  # each library's size and sha256, checked before each load
            if self.path.exists() and _library(self.path) is None:
                shutil.rmtree(self.path, ignore_errors=True)  # a stale entry without a library
            try:
                os.replace(tmp, self.path)  # atomic: a reader sees the whole directory or none
            except OSError:
                if _library(self.path) is None:  # not another process that finished first
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        return self.runner.run([*args, *self.caches])[0]
