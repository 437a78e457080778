"""Bounded reads: every file llamablock reads is a regular file, and no bigger than a limit.

A FIFO opened for reading blocks until a writer comes (forever, for a path given by mistake), and
/dev/zero or /dev/urandom never end, so `open(path).read()` on a path a user typed can hang or
exhaust memory. `regular_file` refuses anything that is not a regular file before it is opened,
saying what the path is instead; `read_text_bounded` / `read_bytes_bounded` then read at most
`limit` bytes, and refuse a file that grew past the limit between the check and the read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_JSON = 64 << 20  # bytes of a JSON config or tokenizer file: tokenizer.json files reach ~20 MB
MAX_TEMPLATE = 1 << 20  # bytes of a chat template file: real ones are a few KB


def kind_of(mode: int) -> str:
    """What a file of `mode` (os.stat's st_mode) is, in words, for messages."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: str | Path, what: str = "file", limit: int | None = None) -> Path:
    """`path`, checked to be a regular file (a symlink to one is fine) of at most `limit` bytes.
    `what` says what it should be ("config file", "text file"), for the FileNotFoundError or
    ValueError that names the path, what it is and what to give instead."""
    p = Path(path)
    try:
        st = p.stat()  # follows symlinks: a link to a FIFO is a FIFO
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {p}") from None
    except OSError as e:
        raise ValueError(f"{what} {p} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} {p} is {kind_of(st.st_mode)}, not a regular file; give the path of the {what} itself")
    if limit is not None and st.st_size > limit:
        raise ValueError(f"{what} {p} has {st.st_size:,} bytes, more than the {limit:,} read; is it the right file?")
    return p


def read_bytes_bounded(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file `path`, refused past `limit` bytes (checked before and while reading)."""
    p = regular_file(path, what, limit)
    # O_NONBLOCK: if the path was swapped for a FIFO since the check, open returns instead of waiting
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{what} {p} is no longer a regular file; give the path of the {what} itself")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what} {p} has more than the {limit:,} bytes read; is it the right file?")
    return data


def read_text_bounded(path: str | Path, limit: int, what: str = "file") -> str:
    """The UTF-8 text of the regular file `path`, of at most `limit` bytes; a ValueError names the
    file when it is not UTF-8."""
    data = read_bytes_bounded(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {e.start}); is it the right file?") from None
