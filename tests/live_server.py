"""A real uvicorn server on a free local port, in a thread, for the tests that need real sockets
(slow clients, the official openai client): `with live_server(app, wait) as port: ...`."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(app, wait: float):
    """Serve `app` on 127.0.0.1 until the block ends; yields the port. `wait` bounds the start and
    the stop (a hang guard, never a measurement)."""
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    end = time.monotonic() + wait
    while not srv.started:
        assert time.monotonic() < end, "the server did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(wait)
