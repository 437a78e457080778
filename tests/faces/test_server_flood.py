"""The server under a flood (regression tests): first-use tracer requests no longer take the
worker threads while the pair trains (one background job, every request answered 503 with
Retry-After at once, the page still answering); invalid text is refused before any work; a
server for this machine answers its own Host names only (DNS rebinding)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from llamablock.studies import trace
from llamablock.training.train import TrainConfig
from llamablock.web import api_trace
from llamablock.web.app import create_app

TINY = TrainConfig(steps=2, batch_size=2, context=32, warmup=0, eval_every=2, eval_windows=2)


@pytest.fixture
def gated_training(monkeypatch):
    """ensure_pair waits for the test's go before training the tiny pair; calls are counted."""
    go, calls = threading.Event(), []

    def ensure(cache_dir, progress=False, recipe=None):
        calls.append(cache_dir)
        go.wait(30)
        return trace.ensure_pair(cache_dir, recipe=TINY)

    monkeypatch.setattr(api_trace, "ensure_pair", ensure)
    return go, calls


def test_a_flood_of_first_tracer_requests_gets_503_and_the_page_answers(tmp_path, gated_training):
    go, calls = gated_training
    client = TestClient(create_app(trace_cache_dir=str(tmp_path)))
    start = time.monotonic()
    with ThreadPoolExecutor(45) as pool:
        replies = list(pool.map(lambda _: client.get("/api/token-tracer", params={"text": "ROMEO:"}), range(45)))
    assert all(r.status_code == 503 and r.headers["Retry-After"] for r in replies)
    assert client.get("/api/gqa").status_code == 200 and client.get("/").status_code == 200
    assert time.monotonic() - start < 20 and len(calls) == 1  # one training, no request waited for it
    go.set()
    api_trace._jobs[str(tmp_path)].join(60)
    assert client.get("/api/token-tracer", params={"text": "ROMEO:"}).status_code == 200


def test_invalid_text_is_refused_before_training(tmp_path, gated_training):
    _, calls = gated_training
    client = TestClient(create_app(trace_cache_dir=str(tmp_path)))
    reply = client.get("/api/token-tracer", params={"text": "caf\u00e9 \u2603"})
    assert reply.status_code == 400 and reply.json()["parameter"] == "text" and calls == []


def test_a_local_server_answers_its_own_host_names_only():
    app = create_app(hosts=["127.0.0.1", "localhost"])
    assert TestClient(app, base_url="http://127.0.0.1:8000").get("/api/presets").status_code == 200
    assert TestClient(app, base_url="http://localhost:8000").get("/").status_code == 200
    assert TestClient(app, base_url="http://attacker.example").get("/api/presets").status_code == 400
