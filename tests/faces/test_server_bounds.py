"""The OpenAI-compatible API's bounds, on a real uvicorn server on 127.0.0.1: a body past
MAX_BODY is refused while it streams, not after it is read; only application/json is read (a web
page can POST text/plain or a form with no CORS preflight); and the event loop is never held by a
request's tokenizing, so the page and /v1/models answer while 40 large requests arrive at once.

Every wait is bounded (WAIT), every loop counted, and the server stops with the module.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model
from live_server import live_server

httpx = pytest.importorskip("httpx")

from llamablock.io.loading import load_model_and_tokenizer  # noqa: E402
from llamablock.web.app import create_app  # noqa: E402
from llamablock.web.generation import ServedModel  # noqa: E402
from llamablock.web.scheduler import Scheduler  # noqa: E402

WAIT = 30  # seconds any step may take before the test fails (a hang guard, not a measurement)
ENCODE_S = 2.5  # how long the slowed tokenizer takes per request: far above POLL_BOUND_S
# An answer from a free event loop takes a few milliseconds (the issue asks for 100 ms); 1 s leaves
# room for a test machine whose 2 cores are shared and loaded (a 0.52 s poll was seen there), and is
# still well under one slowed encode, which a blocked loop would make every poll wait for.
POLL_BOUND_S = 1.0
JSON = {"Content-Type": "application/json"}


class SlowTokenizer:
    """The tiny model's tokenizer, taking ENCODE_S per encode: stands for a megabyte prompt, so that
    a tokenize on the event loop would hold every other request that long. Sleeping releases the
    GIL like the Rust tokenizer does, so only the loop's own blocking is measured."""

    def __init__(self, tok):
        self.tok, self.encodes = tok, 0

    def encode(self, text, add_special_tokens=True):
        self.encodes += 1
        time.sleep(ENCODE_S)
        return self.tok.encode(text, add_special_tokens)

    def __getattr__(self, name):
        return getattr(self.tok, name)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    f = tmp_path_factory.mktemp("bounds") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=64),
                    extra_kv={"tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})
    model, tok = load_model_and_tokenizer(f)
    slow = SlowTokenizer(tok)
    served = ServedModel("tiny", model, slow, Scheduler(model, tok, max_queue=2), 0, (str(f),))
    with live_server(create_app(served=served), WAIT) as port:
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", port=port, tok=slow)


def _chunked_upload(port: int, total: int, chunk: int = 64 << 10) -> tuple[bytes, int]:
    """POST `total` bytes of JSON-typed chunked body over a raw socket, stopping as soon as the
    server answers or closes; (the start of its reply, the bytes of body sent)."""
    sent, piece = 0, b" " * chunk
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        deadline = time.monotonic() + WAIT
        while sent < total and time.monotonic() < deadline:
            if select.select([s], [], [], 0)[0]:
                break  # the server has answered (or closed): stop sending, as a client would
            try:
                s.sendall(b"%x\r\n" % chunk + piece + b"\r\n")
            except OSError:  # the server closed the connection while we were still sending
                break
            sent += chunk
        s.settimeout(WAIT)
        try:
            reply = s.recv(4096)
        except OSError:
            reply = b""
    return reply, sent


def test_a_chunked_body_past_max_body_is_refused_while_it_streams(server):
    """Before: `request.body()` read the whole chunked body (no Content-Length to check), +178 MB
    for 200 MB, before the 413. Now reading stops at MAX_BODY + 1: what the client manages to send
    beyond that is only what the socket buffers hold, far from the 64 MiB offered."""
    total = 64 << 20
    reply, sent = _chunked_upload(server.port, total)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert sent < 16 << 20, f"the server read {sent:,} of {total:,} bytes before refusing"


def test_a_declared_content_length_past_max_body_is_refused_before_reading(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (1 << 30))  # and no body at all: nothing to wait for
        assert s.recv(4096).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("headers, content", [
    pytest.param({"Content-Type": "text/plain"}, b'{"model": "tiny", "prompt": "a"}', id="text-plain"),
    pytest.param({"Content-Type": "application/x-www-form-urlencoded"}, b"model=tiny&prompt=a", id="form"),
    pytest.param({"Content-Type": "multipart/form-data; boundary=x"}, b"--x--", id="multipart"),
    pytest.param({}, b'{"model": "tiny", "prompt": "a"}', id="no-type"),
])
def test_a_body_not_sent_as_json_is_refused_with_415(server, path, headers, content):
    """Before: any body was parsed as JSON, so a page on any site could make the local server
    generate with a text/plain POST (which needs no CORS preflight)."""
    r = httpx.post(server.url + path, content=content, headers=headers, timeout=WAIT)
    assert r.status_code == 415, r.text[:200]
    err = r.json()["error"]
    assert err["code"] == "unsupported_media_type" and "application/json" in err["message"]


def test_json_with_a_charset_is_read(server):
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 1},
                   headers={"Content-Type": "application/json; charset=utf-8"}, timeout=WAIT)
    assert r.status_code == 200, r.text[:200]


def test_the_page_and_models_answer_while_40_large_requests_arrive(server):
    """6 chat requests whose tokenizing takes ENCODE_S each, and 34 chunked bodies past MAX_BODY,
    all at once; meanwhile / and /v1/models are asked every 50 ms and each answers within
    POLL_BOUND_S. Before, the prompt was templated and tokenized on the event loop, which held
    every other request for the whole of it (5.5-7.7 s for /v1/models under 8 such prompts)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 1}
    before = server.tok.encodes
    done = threading.Event()
    times: list[tuple[float, str]] = []

    def poll():
        with httpx.Client(base_url=server.url, timeout=WAIT) as c:
            for _ in range(400):  # bounded: 400 x 50 ms at most
                if done.is_set():
                    break
                for path in ("/v1/models", "/"):
                    start = time.monotonic()
                    assert c.get(path).status_code == 200
                    times.append((time.monotonic() - start, path))
                time.sleep(0.05)

    def chat(_):
        return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=WAIT).status_code

    def big(_):
        return _chunked_upload(server.port, 4 << 20)[0][:12]

    with ThreadPoolExecutor(41) as pool:
        poller = pool.submit(poll)
        time.sleep(0.1)
        asks = [pool.submit(chat, i) for i in range(6)] + [pool.submit(big, i) for i in range(34)]
        codes = [a.result(WAIT * 2) for a in asks]
        done.set()
        poller.result(WAIT)
    assert server.tok.encodes - before == 6  # the prompts were in fact tokenized, not refused early
    assert all(c in (200, 503) for c in codes[:6]), codes[:6]  # answered, or the queue of 2 was full
    assert all(c == b"HTTP/1.1 413" for c in codes[6:]), codes[6:]
    slowest, path = max(times)
    assert slowest < POLL_BOUND_S, f"a poll of {path} took {slowest:.2f} s while requests were prepared"
    assert len(times) >= 20, "too few polls while the requests ran"


def test_a_prompt_the_context_cannot_hold_is_refused_before_tokenizing(server):
    """A text longer than context x the vocabulary's longest token cannot fit, whatever its tokens:
    it is refused without the (slow, for a megabyte) tokenizing."""
    before = server.tok.encodes
    text = "x" * (64 * server.tok.max_token_chars + 1)
    for path, body in (("/v1/completions", {"model": "tiny", "prompt": text}),
                       ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": text}]})):
        r = httpx.post(server.url + path, json=body, timeout=WAIT)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:200]
    assert server.tok.encodes == before


def test_a_chat_template_that_computes_for_minutes_is_stopped(server, monkeypatch):
    """The template comes from the model file: one whose arithmetic is within every size bound yet
    runs for minutes in C (holding the interpreter lock, and with it the whole server) is rendered
    in a child process and stopped at its time limit (2 s here, TEMPLATE_SECONDS in use)."""
    from llamablock.io import chat_template

    monkeypatch.setattr(chat_template, "TEMPLATE_SECONDS", 2)
    inner = server.tok.tok
    monkeypatch.setattr(inner, "chat_template", "{% set big = range(100000) | list %}{% for i in range(10000) %}"
                                                "{% set x = (big * 40) | sum %}{% endfor %}x")
    start = time.monotonic()
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user",
                   "content": "hi"}], "max_tokens": 1}, timeout=WAIT)
    assert r.status_code == 400 and "ran past 2 s" in r.json()["error"]["message"], r.text[:300]
    assert time.monotonic() - start < WAIT / 2


def test_a_fifo_as_lab_results_leaves_the_gqa_figure_unmeasured(tmp_path):
    """--lab-results is read at every /api/gqa request: a FIFO there held a request thread for ever."""
    from concurrent.futures import TimeoutError as Late

    from fastapi.testclient import TestClient

    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(lambda: TestClient(create_app(lab_results=str(fifo))).get("/api/gqa"))
        try:
            r = reply.result(WAIT)
        except Late:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked reader go
            pytest.fail(f"/api/gqa was still reading the FIFO after {WAIT} s")
    assert r.status_code == 200 and r.json()["measured_decode"] is None
