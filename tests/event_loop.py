"""An asyncio event loop on a thread of its own, as the server runs one: the scheduler's jobs send
their events there (tests/faces/test_scheduler.py, test_request_paths.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading


@contextlib.contextmanager
def loop_thread(wait: float):
    """The running loop; stopped and its thread joined (within `wait` seconds) on exit."""
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    try:
        yield lp
    finally:
        lp.call_soon_threadsafe(lp.stop)
        t.join(wait)
