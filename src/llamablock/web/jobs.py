"""What the scheduler (llamablock.web.scheduler) runs: a request as the API hands it over (`Job`),
the same request once it has a row in the batch (`Running`: the row and its Request, which
chooses each token and says when it stops), and the two ways it ends early (`Cancelled`: its client
left; `Busy`: the queue was full).

A Job's events go to the event loop that submitted it: ("text", str), then ("done", Generation) or
("error", Exception), each handed over with `loop.call_soon_threadsafe` from the scheduler's thread.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from llamablock.runtime.batch import Row
from llamablock.runtime.request import Request
from llamablock.runtime.sampling import Sampling


class Cancelled(Exception):
    """The client went away: the job stops before its next step."""


class Busy(Exception):
    """The queue is full."""


@dataclass
class Job:
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    seed: int | None
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    id: int = 0
    arrived: float = 0.0  # time.monotonic() at submit

    def emit(self, kind: str, value) -> None:
        """From the scheduler's thread: hand one event to the request's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: the server is stopping
            self.cancelled.set()


@dataclass(eq=False)
class Running:
    """A job in the batch: its row, its Request (llamablock.runtime.request: sampling, tokens so far,
    text stream, stop rules) and its times (time.monotonic())."""

    job: Job
    row: Row
    request: Request
    started: float = 0.0
    first: float = 0.0  # its first token
    last: float = 0.0  # its latest token

