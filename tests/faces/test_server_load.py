"""A bounded load on the batching server: 100 requests, 8 clients at a time, half of them streamed,
through the official `openai` client to a real uvicorn server on 127.0.0.1 (a tiny random Llama,
--parallel 4, so requests also wait in the queue).

Every answer must come back whole: its text equal to `generate` alone on the same prompt, its
finish reason and usage right. Afterwards the server must hold nothing of the load: no running
or queued request, no batched cache, no request's tensors still alive, and a resident set back
within RSS_SLACK of its level before (measured after a warm-up round, so that the allocations
every server makes once, thread pools and kernels, are in both figures).
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model
from live_server import live_server
from prometheus_client.parser import text_string_to_metric_families

openai = pytest.importorskip("openai", reason="the openai client is a test dependency: pip install -e '.[test]'")
httpx = pytest.importorskip("httpx")

from llamablock.io.loading import load_model_and_tokenizer  # noqa: E402
from llamablock.runtime.engine import EagerEngine  # noqa: E402
from llamablock.runtime.generate import generate  # noqa: E402
from llamablock.web.app import create_app  # noqa: E402
from llamablock.web.generation import ServedModel  # noqa: E402
from llamablock.web.scheduler import Job, Scheduler  # noqa: E402

WAIT = 60  # seconds any wait may take (a hang guard, never a measurement)
REQUESTS, CLIENTS, NEW = 100, 8, 12
PROMPTS = ["ROMEO: ", "JULIET: O Romeo", "To be, or not", "Friends, Romans, countrymen, lend me", "A"]
# The resident set is the coarse check (the exact ones count live tensors and Job objects): it may
# move by allocator noise (pages glibc keeps, the interpreter's arenas; a few MiB were seen), and
# catches growth that scales with the load, such as 100 requests' worth of anything sizeable.
RSS_SLACK = 32 * 2**20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))  # type(): no __class__ lookups


@pytest.fixture(scope="module")
def server(tmp_path_factory):

    f = tmp_path_factory.mktemp("load") / "tiny.gguf"
    # 4 KiB of keys and values per token (2 layers x 4 heads x 64 x 2 x float32), so that caches weigh
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=4, head_dim=64, max_position_embeddings=256))
    model, tok = load_model_and_tokenizer(f)
    served = ServedModel("tiny", model, tok, Scheduler(model, tok, max_queue=CLIENTS, parallel=4), 0, (str(f),))
    with live_server(create_app(served=served), WAIT) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=WAIT)
        served.url = f"http://127.0.0.1:{port}"
        yield served, client, {p: generate(EagerEngine(model), tok.encode(p), NEW, eos_ids=tok.eos_ids, tokenizer=tok)
                               for p in PROMPTS}


def _ask(client, i: int) -> tuple[str, str, int]:
    prompt = PROMPTS[i % len(PROMPTS)]
    if i % 2:
        chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=NEW, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
        return text, finish, chunks[-1].usage.completion_tokens
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=NEW, temperature=0)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens


def _load(client, n: int) -> list:
    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(lambda i: (i, _ask(client, i)), range(n)))


def test_a_hundred_requests_eight_at_a_time_all_complete_are_counted_and_leave_nothing_behind(server):
    served, client, want = server
    sched: Scheduler = served.worker
    _load(client, CLIENTS)  # warm-up: what the first requests allocate once
    tensors, rss = _live_tensors(), _rss()
    answers = _load(client, REQUESTS)
    assert len(answers) == REQUESTS
    for i, (text, finish, tokens) in answers:
        ref = want[PROMPTS[i % len(PROMPTS)]]
        assert (text, tokens) == (ref.text, len(ref.tokens)), f"request {i}"
        assert finish == ("length" if ref.stop_reason == "length" else "stop"), f"request {i}"
    end = time.monotonic() + WAIT
    while sched.running or not sched.jobs.empty():
        assert time.monotonic() < end, "the scheduler did not go idle"
        time.sleep(0.01)
    assert sched.engine.cache is None and sched.engine.rows == []
    # Every request's state released. Polled: a streamed reply's generator holds its Job until
    # Starlette closes the response task, which may end just after the client has read "[DONE]".
    while [o for o in gc.get_objects() if type(o) is Job]:
        assert time.monotonic() < end, "a request's Job outlived its reply"
        time.sleep(0.01)
        gc.collect()
    assert _live_tensors() <= tensors
    grown = _rss() - rss
    assert grown < RSS_SLACK, f"the resident set grew by {grown / 2**20:.1f} MiB over the load"
    _check_metrics(served, want)


def _check_metrics(served, want) -> None:
    """GET /metrics, parsed by Prometheus' own parser, counts the load and its warm-up."""
    reply = httpx.get(f"{served.url}/metrics", timeout=WAIT)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(reply.text) for s in f.samples}
    n = REQUESTS + CLIENTS
    finished = sum(v for (name, _), v in samples.items() if name == "llamablock_requests_total")
    tokens = sum(len(want[PROMPTS[i % len(PROMPTS)]].tokens) for i in [*range(CLIENTS), *range(REQUESTS)])
    assert finished == n and samples[("llamablock_time_to_first_token_seconds_count", ())] == n
    assert samples[("llamablock_generated_tokens_total", ())] == tokens
    assert samples[("llamablock_requests_running", ())] == 0
