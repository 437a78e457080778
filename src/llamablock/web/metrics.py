"""What the server counts, for GET /metrics in Prometheus' text format (prometheus_client).

    llamablock_requests_running              requests decoding or prefilling now (gauge)
    llamablock_requests_queued               requests waiting for a free row (gauge)
    llamablock_requests_total{outcome}       finished requests: length, eos, stop_string, cancelled, error
    llamablock_prompt_tokens_total           prompt tokens prefilled
    llamablock_generated_tokens_total        tokens generated
    llamablock_time_to_first_token_seconds   from arrival (queue included) to the first token (histogram)
    llamablock_time_per_output_token_seconds between a request's successive tokens (histogram)

The names and the two latency histograms follow vLLM's (vllm:time_to_first_token_seconds,
vllm:time_per_output_token_seconds), so a dashboard built for one reads the other. Each server
has its own registry, not prometheus_client's global one: a process may run several (the tests).
`finished` also writes the request's log line (logger llamablock.serve): its id, tokens, times.
"""

from __future__ import annotations

import logging
from typing import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

log = logging.getLogger("llamablock.serve")

# Seconds. A first token waits for the queue and a prefill: up to minutes on a CPU under load.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
# A decode step of one batch: milliseconds on a GPU, tens to hundreds of them on a CPU.
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class ServerMetrics:
    """The counters of one scheduler; `running` and `queued` are read when scraped."""

    def __init__(self, running: Callable[[], int], queued: Callable[[], int]):
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("llamablock_requests_running", "Requests decoding or prefilling now", registry=r).set_function(running)
        Gauge("llamablock_requests_queued", "Requests waiting for a free row", registry=r).set_function(queued)
        self.requests = Counter("llamablock_requests", "Finished requests, by how they ended", ["outcome"], registry=r)
        self.prompt_tokens = Counter("llamablock_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generated_tokens = Counter("llamablock_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("llamablock_time_to_first_token_seconds",
                              "From a request's arrival (its wait in the queue included) to its first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.token_latency = Histogram("llamablock_time_per_output_token_seconds",
                                       "Between a request's successive tokens", buckets=TOKEN_BUCKETS, registry=r)

    def text(self) -> bytes:
        """The registry in Prometheus' text exposition format."""
        return generate_latest(self.registry)

    def finished(self, rid: int, outcome: str, prompt_tokens: int, tokens: int, arrived: float,
                 started: float | None, first: float | None, now: float) -> None:
        """Count a request that has ended (`outcome`: its stop reason, cancelled or error) and log one
        line: its id, tokens, and where its time went (times from time.monotonic(); `started`: when
        it took a row, `first`: its first token, None when it got none)."""
        self.requests.labels(outcome).inc()
        line = f"request {rid}: {outcome}, {prompt_tokens} prompt tokens, {tokens} new"
        if first is None:
            log.info("%s, %.3f s in all", line, now - arrived)
            return
        decode = now - first
        rate = f", {(tokens - 1) / decode:.1f} tokens/s" if tokens > 1 and decode > 0 else ""
        log.info("%s; queued %.3f s, first token %.3f s, %.3f s in all%s", line, started - arrived, first - arrived,
                 now - arrived, rate)
