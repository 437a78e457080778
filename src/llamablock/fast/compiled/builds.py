"""Which compiled engines have been built for which model files: an index beside the packages.

An AOTInductor package is named by a hash of the weights it was compiled from, so finding one
means building the static layout and hashing it: a whole float copy of the model. This index
answers "is there a compiled engine for this file, in this format, for this many tokens?" from
the file's identity (path, size, modification time) instead, so that `llamablock generate` can
choose the compiled engine by default when one exists and the eager model otherwise
(`--engine auto`). It also keeps how long each build took, for the next build's progress line.

    <package dir>/builds.json   {"<path>|<size>|<mtime>|<code>|<format>": {"lengths": {L or "LxB": [package, ...]},
                                                                           "seconds": last build,
                                                                           "autotune": bool}}
An entry counts only while its packages are still on disk (pruning may delete them) and intact
(a library cut short, changed or set aside as damaged: fast/compiled/package_check.py; one line
says so, and `--engine auto` runs the eager model rather than compile for minutes), and only for
the code that built it (`<code>`: torch's version and llamablock's source digest, which the
packages' own names hash too): after an upgrade or an edit, `--engine auto` runs the eager model
and says to rebuild, instead of compiling in the foreground for minutes. `autotune` is how the
build was made (`llamablock compile --no-autotune` or not): the packages' names hash the settings,
so `generate` must ask for the same ones to find them. A build for a batch of B sequences (`llamablock
compile --batch B`, the server's `--parallel B`: llamablock.fast.compiled.batch_compiled) is listed as "LxB".

The index is read with its shape checked (`_read`): an entry of another shape (edited by hand,
written by another version) is left out, and one line on stderr names the file and what is wrong,
never a traceback; the next build writes the index without it. Builds change it under a lock
(util/files.file_lock on `builds.json.lock` beside it) and replace it whole (atomic_write), so
that processes building at once each keep the others' entries.
"""

from __future__ import annotations

import errno
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llamablock.util.files import atomic_write, file_lock

if TYPE_CHECKING:
    from llamablock.io.source import ModelSource

_said: set[str] = set()  # the index's problems already said by this process


def _index_file() -> Path:
    from llamablock.fast.compiled.aoti_step import package_dir

    return package_dir() / "builds.json"


def _file(path: Path) -> str:
    st = Path(path).stat()
    return f"{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}"


def weights_identity(path: Path, fmt: str, grouped: bool = False) -> str | None:
    """What determines the weights a compiled engine of the file at `path` in `fmt` holds: the
    file's identity, the format, and the blocks' layout the plan chose (`grouped`: rows in groups
    of 8); the code that reads them is in the package's name already (aoti_step.package_key).
    None for a folder, whose own modification time does not follow a weight file edited in place."""
    return f"{_file(path)}|{fmt}|rows grouped {grouped}" if Path(path).is_file() else None


def _code() -> str:
    import torch

    from llamablock.fast.compiled.aoti_step import source_digest

    return f"torch {torch.__version__} llamablock {source_digest()}"


def _key(path: Path, fmt: str) -> str:
    return f"{_file(path)}|{_code()}|{fmt}"


def _read() -> dict:
    """The index's entries of the right shape; the others left out, with one line naming the file."""
    f = _index_file()
    try:
        d = json.loads(f.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        _say(f"{f} cannot be read as JSON ({e}): ignoring it")
        return {}
    if not isinstance(d, dict):
        _say(f"{f} holds a JSON {type(d).__name__}, not an object of builds: ignoring it")
        return {}
    problems = {k: why for k, v in d.items() if (why := _problem(v))}
    if problems:
        first = next(iter(problems.values()))
        n = len(problems)
        _say(f"{f}: {n} entr{'y' if n == 1 else 'ies'} of another shape ignored ({first})")
    return {k: v for k, v in d.items() if k not in problems}


def _problem(entry) -> str | None:
    """What is wrong with one entry of the index, or None for {"lengths": {"L" or "LxB": [path,
    ...]}, "seconds": number or null, "autotune": bool}."""
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__} where an object belongs"
    lengths = entry.get("lengths")
    if not isinstance(lengths, dict):
        return '"lengths" is not an object'
    for size, dirs in lengths.items():
        if not re.fullmatch(r"\d+(x\d+)?", size):
            return f'the size "{size}" is not a length (L, or LxB)'
        if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
            return f'the packages of size {size} are not a list of paths'
    seconds = entry.get("seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
        return '"seconds" is not a number'
    if not isinstance(entry.get("autotune", True), bool):
        return '"autotune" is not true or false'
    return None


def _say(problem: str, again: str = "; the next `llamablock compile` writes it again") -> None:
    """One line on stderr, once a process: the index is read several times a command."""
    if problem not in _said:
        _said.add(problem)
        print(f"llamablock: {problem}{again}", file=sys.stderr, flush=True)


def _size(length: int, batch: int) -> str:
    return str(length) if batch == 1 else f"{length}x{batch}"


def record(path: Path, fmt: str, length: int, packages: list[Path], seconds: float, autotune: bool = True,
           batch: int = 1) -> None:
    """Note that the engine for `path` in `fmt` at cache `length` (for `batch` sequences) lives in
    `packages`, built with `autotune` or not; entries of this file and format by other code go
    (their packages can no longer serve). Read, changed and replaced under the index's lock."""
    f = _index_file()
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(f.with_name(f.name + ".lock"), required=False):  # a read-only cache: written only if changed
            _record(f, path, fmt, length, packages, seconds, autotune, batch)
    except OSError as e:  # a read-only or full cache: the build serves this run, and the next looks for it again
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
            raise
        _say(f"{f} cannot be written ({e.strerror}): this build is not recorded, and `--engine auto` will not "
             "find it", again="")


def _record(f: Path, path: Path, fmt: str, length: int, packages: list[Path], seconds: float, autotune: bool,
            batch: int) -> None:
    """record()'s change of the index, under its lock; nothing written where nothing changes (a run
    that loaded the build it found)."""
    read = _read()
    before = json.dumps(read, sort_keys=True)
    index = {k: v for k, v in read.items() if k == _key(path, fmt) or not _same_file_and_format(k, path, fmt)}
    entry = index.setdefault(_key(path, fmt), {"lengths": {}, "seconds": None})
    size = _size(length, batch)
    entry["lengths"][size] = [str(p) for p in packages]
    if seconds > 0:
        entry["seconds"] = seconds
    if entry.get("autotune", autotune) != autotune:  # the other setting's packages are not these
        entry["lengths"] = {size: entry["lengths"][size]}
    entry["autotune"] = autotune
    if json.dumps(index, sort_keys=True) != before:
        atomic_write(f, lambda p: p.write_text(json.dumps(index, indent=1)))


def build_name(fmt: str, kv: str, activations: str, scaling: str = "") -> str:
    """The format a build is recorded under: the weights' format, the KV cache's dtype (the plan's
    kv_dtype) where it is not the activations' (a program takes its cache in one dtype: another is
    another build), and the context and RoPE scaling the command's flags set, if any (`scaled_name`:
    a program's angles are its config's)."""
    name = fmt if kv == activations else f"{fmt} kv {kv}"
    return f"{name} {scaling}" if scaling else name


def scaled_name(cfg) -> str:
    """The context and RoPE scaling of `cfg`, as a build of a model the flags rescaled is recorded."""
    return f"ctx {cfg.max_seq_len} rope {json.dumps(cfg.rope_scaling, sort_keys=True)} theta {cfg.rope_theta:g}"


def record_engine(path: Path, engine, seconds: float, scaling: str = "") -> None:
    """Record the compiled `engine` of the file at `path` as built (its format and kv dtype, cache
    length, batch, packages and autotune setting; `scaling` where flags rescaled the model): the one
    call every command that builds makes."""
    kv, act = (str(t).removeprefix("torch.") for t in (engine.kv_dtype, engine.model.embed.weight.dtype))
    fmt = build_name(engine.fmt, kv, act, scaling)
    record(path, fmt, engine.length, engine.packages(), seconds, autotune=engine.autotune, batch=engine.batch)


def any_build(path: Path) -> bool:
    """Whether the index names any build of this file by this code, in any format (cheap: no look
    into the file)."""
    if not Path(path).exists():
        return False  # the loader says what is wrong with the path
    prefix = _key(path, "")
    return any(k.startswith(prefix) for k in _read())


def stale_build(path: Path) -> bool:
    """Whether the index names a build of this file by other code only (another torch or
    llamablock): its packages cannot serve, and `llamablock compile` builds them again."""
    if not Path(path).exists():
        return False
    mine, prefix = _key(path, ""), _file(path) + "|"
    keys = [k for k in _read() if k.startswith(prefix)]
    return bool(keys) and not any(k.startswith(mine) for k in keys)


def built_length(path: Path, fmt: str, batch: int = 1) -> int | None:
    """The longest cache length built for `path` in `fmt` for `batch` sequences whose packages are
    all on disk, or None."""
    from llamablock.fast.compiled.package_check import unusable

    ok = []
    for size, dirs in _read().get(_key(path, fmt), {}).get("lengths", {}).items():
        if _batch_of(size) != batch or not dirs or not all(Path(d).is_dir() for d in dirs):
            continue
        why = next(filter(None, map(unusable, map(Path, dirs))), None)
        if why is None:
            ok.append(int(size.split("x")[0]))
        elif why not in _said:  # never loaded, never compiled again in the foreground: auto runs eagerly
            _said.add(why)
            print(f"llamablock: the compiled build of {Path(path).name} in {fmt} is damaged ({why}); "
                  f"`llamablock compile --model {path}` builds it again, until then `--engine auto` runs eagerly",
                  file=sys.stderr, flush=True)
    return max(ok) if ok else None


def _batch_of(size: str) -> int:
    return int(size.split("x")[1]) if "x" in size else 1


def autotuned(path: Path, fmt: str) -> bool:
    """Whether the recorded build of `path` in `fmt` was autotuned (True when there is none: the default)."""
    return bool(_read().get(_key(path, fmt), {}).get("autotune", True))


def _same_file_and_format(key: str, path: Path, fmt: str) -> bool:
    return key.startswith(_file(path) + "|") and key.endswith("|" + fmt)


def last_build_seconds(path: Path, fmt: str) -> float | None:
    """How long the last build of `path` in `fmt` took, by this code or, after an upgrade, the code before."""
    index = _read()
    same = [v for k, v in index.items() if _same_file_and_format(k, path, fmt)]
    return index.get(_key(path, fmt), same[0] if same else {}).get("seconds")


def not_built_note(source: ModelSource, batch: int) -> str:
    """The plan's note where no compiled build serves `source` (fast/plan.py): the command that builds one."""
    flags = (f" --model {source.given}" if source.given else "") + (f" --batch {batch}" if batch > 1 else "")
    command, user = f"`llamablock compile{flags}`", "generate" if batch == 1 else "serve"
    if stale_build(source.path):
        return f"eager engine: the compiled one was built by another llamablock or torch; {command} builds it again"
    return f"eager engine: {command} builds the compiled one once, then {user} uses it"
