"""The index of compiled builds (fast/compiled/builds.py): an index of another shape is one line
naming the file, never a traceback, and its good entries still count; writers at once keep every
entry.

Reference: what was recorded. Each wrong shape below is valid JSON that an edit by hand or another
version could leave; the writers are separate processes, as two `llamablock compile` runs are.
"""

from __future__ import annotations

import errno
import json
import multiprocessing

import pytest

from llamablock.fast.compiled import builds

WRITERS, ENTRIES = 8, 25


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A fresh index under a temporary inductor folder, and a model file to index builds of."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(builds, "_said", set(), raising=False)  # said again in each test
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights")
    package = tmp_path / "package"
    package.mkdir()
    builds.record(model, "q8", 64, [package], 12.5)
    return builds._index_file(), model, package


def _ask(model):
    """Everything a command asks of the index about `model`, in the format built (q8) and in q4."""
    return (builds.any_build(model), builds.stale_build(model), builds.built_length(model, "q8"),
            builds.autotuned(model, "q8"), builds.last_build_seconds(model, "q8"),
            builds.built_length(model, "q4"), builds.autotuned(model, "q4"), builds.last_build_seconds(model, "q4"))


BUILT = (True, False, 64, True, 12.5, None, True, None)  # the q8 build recorded, no q4 one
NOTHING = (False, False, None, True, None, None, True, None)
# each wrong shape as the entry of the same file in q4, beside the good q8 one (None: the whole index)
WRONG = {
    "a list": None,
    "cut short": None,
    "an entry that is not an object": 3,
    '"lengths" not an object': {"lengths": [64]},
    "a size that is not a number": {"lengths": {"long": ["/x"]}},
    "packages that are not paths": {"lengths": {"64": "/x"}},
    "seconds a string": {"lengths": {"64": []}, "seconds": "12"},
    "autotune a string": {"lengths": {"64": []}, "autotune": "no"},
}


@pytest.mark.parametrize("shape", list(WRONG))
def test_an_index_of_another_shape_is_one_line_naming_it(index, shape, capsys):
    f, model, package = index
    good = json.loads(f.read_text())
    assert _ask(model) == BUILT
    if shape == "a list":
        f.write_text(json.dumps([good]))
    elif shape == "cut short":
        f.write_text(json.dumps(good)[:-5])
    else:
        f.write_text(json.dumps({**good, builds._key(model, "q4"): WRONG[shape]}))
    capsys.readouterr()
    answers = [_ask(model), _ask(model)]  # read several times: said once
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and str(f) in lines[0], lines
    assert answers[0] == answers[1] == (NOTHING if WRONG[shape] is None else BUILT)  # only the bad entry goes
    builds.record(model, "q4", 128, [package], 20.0)  # the next build writes it whole again
    assert builds.built_length(model, "q4") == 128 and builds.last_build_seconds(model, "q4") == 20.0
    assert builds.built_length(model, "q8") == (None if WRONG[shape] is None else 64)
    assert capsys.readouterr().err == ""


def _write(args) -> None:
    folder, writer = args
    model = folder / f"model-{writer}.gguf"
    for length in range(1, ENTRIES + 1):
        builds.record(model, "q8", length, [folder / f"package-{writer}-{length}"], float(length))


def test_writers_at_once_keep_every_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    for writer in range(WRITERS):
        (tmp_path / f"model-{writer}.gguf").write_bytes(b"weights %d" % writer)
    builds._code()  # the source digest, once, before the writers fork
    with multiprocessing.get_context("fork").Pool(WRITERS) as pool:
        pool.map(_write, [(tmp_path, w) for w in range(WRITERS)])
    index = json.loads(builds._index_file().read_text())
    kept = {(key.split("|")[0], size) for key, entry in index.items() for size in entry["lengths"]}
    want = {(str((tmp_path / f"model-{w}.gguf").resolve()), str(n)) for w in range(WRITERS)
            for n in range(1, ENTRIES + 1)}
    assert kept == want, f"{len(want - kept)} of {len(want)} entries lost"


def test_a_read_only_index_serves_its_builds_and_a_new_one_is_one_line(index, monkeypatch, capsys):
    """`generate` records the build it loaded: where that changes nothing, nothing is written (a
    read-only cache once ended the run with "Read-only file system"); a new build that cannot be
    recorded is one line naming the index, and the run goes on."""
    f, model, package = index

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(f))

    monkeypatch.setattr(builds, "atomic_write", refuse)
    builds.record(model, "q8", 64, [package], 0.0)  # loaded, not built: the index already says so
    assert builds.built_length(model, "q8") == 64 and capsys.readouterr().err == ""
    builds.record(model, "q4", 64, [package], 3.0)
    [line] = capsys.readouterr().err.splitlines()
    assert str(f) in line and "Read-only file system" in line and "not recorded" in line
    assert builds.built_length(model, "q4") is None
