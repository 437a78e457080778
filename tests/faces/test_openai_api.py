"""The OpenAI-compatible API of `llamablock serve`, spoken to by the official `openai` client.

A tiny 2024 model is trained for two steps into a run directory and served by uvicorn on a free
port of 127.0.0.1, in this process. The reference for every text is llamablock's own `generate`
on the same model and prompt (greedy), so each test checks the API's plumbing: templates, stop
strings, lengths, usage counts, streaming, errors, the queue. Its batched engine waits on a gate
before every decode step; the gate is open except in the tests that need a generation held mid-way
(the page answering meanwhile, a client leaving), so nothing depends on timing.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import SimpleNamespace

import pytest

openai = pytest.importorskip("openai", reason="the openai client is a test dependency: pip install -e '.[test]'")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from llamablock.cli import build_parser  # noqa: E402
from llamablock.fast.compiled.static_engine import StaticEngine  # noqa: E402
from llamablock.io.loading import load_model_and_tokenizer  # noqa: E402
from llamablock.model import Decoder  # noqa: E402
from llamablock.presets import preset  # noqa: E402
from llamablock.runtime.batch import EagerBatchEngine  # noqa: E402
from llamablock.runtime.engine import EagerEngine  # noqa: E402
from llamablock.runtime.generate import generate  # noqa: E402
from llamablock.runtime.sampling import Sampling  # noqa: E402
from llamablock.training.train import TrainConfig, train  # noqa: E402
from llamablock.web.app import create_app  # noqa: E402
from llamablock.web.generation import ServedModel, load_served  # noqa: E402
from llamablock.web.scheduler import Job, Scheduler  # noqa: E402

GATE = threading.Event()
GATE.set()
WAIT = 30  # seconds any test waits for the server before failing (a hang guard, never a measurement)


class GatedEngine(EagerBatchEngine):
    """The batched eager engine, waiting on GATE before each decode step and counting its steps."""

    made: list["GatedEngine"] = []

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.steps = 0
        GatedEngine.made.append(self)

    def step(self, tokens):
        assert GATE.wait(WAIT), "the gate stayed closed"
        self.steps += 1
        return super().step(tokens)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(condition, what: str):
    end = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    train(preset("llama-2024-small"), TrainConfig(steps=2, batch_size=2, context=32, warmup=0, eval_every=2,
                                                  eval_windows=2), run, progress=False)
    model, tok = load_model_and_tokenizer(run)
    worker = Scheduler(model, tok, max_queue=2, engine_factory=GatedEngine)
    served = ServedModel("tiny", model, tok, worker, 0, (str(run),))
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(served=served), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    _until(lambda: srv.started, "the server to start")
    url = f"http://127.0.0.1:{port}"
    yield SimpleNamespace(url=url, served=served, model=model, tok=tok, run=run,
                          client=openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT))
    GATE.set()
    srv.should_exit = True
    thread.join(WAIT)


@pytest.fixture(autouse=True)
def _gate_open():
    GATE.set()
    yield
    GATE.set()


def reference(server, text: str, n: int, chat=False, temperature=0.0, seed=None) -> str:
    tok = server.tok
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]) if chat else text)
    return generate(EagerEngine(server.model), ids, n, Sampling(temperature), seed=seed, eos_ids=tok.eos_ids, tokenizer=tok).text


# -- answers ------------------------------------------------------------------------------------

def test_models_lists_the_served_model(server):
    assert [m.id for m in server.client.models.list().data] == ["tiny"]
    assert server.client.models.retrieve("tiny").owned_by == "llamablock"


def test_completion_is_the_library_greedy_text_with_usage_counts(server):
    r = server.client.completions.create(model="tiny", prompt="ROMEO:\nBut soft", max_tokens=12, temperature=0)
    assert r.choices[0].text == reference(server, "ROMEO:\nBut soft", 12)
    assert r.choices[0].finish_reason == "length"
    n_prompt = len(server.tok.encode("ROMEO:\nBut soft"))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n_prompt, 12, n_prompt + 12)


def test_streamed_completion_joins_to_the_non_streamed_text(server):
    kw = dict(model="tiny", prompt="JULIET:\nO Romeo", max_tokens=25, temperature=0)
    whole = server.client.completions.create(**kw).choices[0].text
    chunks = list(server.client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert len(chunks) > 2 and chunks[-1].choices[0].finish_reason == "length"


def test_chat_applies_the_template_and_streams_the_same_text(server):
    msgs = [{"role": "user", "content": "Speak"}]
    r = server.client.chat.completions.create(model="tiny", messages=msgs, max_tokens=15, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == reference(server, "Speak", 15, chat=True)
    assert r.usage.prompt_tokens == len("USER:\nSpeak\n\nASSISTANT:\n")  # the export's template, one token a character
    chunks = list(server.client.chat.completions.create(model="tiny", messages=msgs, max_tokens=15, temperature=0,
                                                        stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 15


def test_stop_string_cuts_the_text_before_it(server):
    """Sampled with a seed (the barely trained model's greedy text repeats one character)."""
    full = reference(server, "KING:\n", 30, temperature=1.0, seed=3)
    stop = next(full[i:i + 2] for i in range(3, len(full) - 2) if full[i:i + 2] not in full[:i + 1])
    r = server.client.completions.create(model="tiny", prompt="KING:\n", max_tokens=30, temperature=1.0, seed=3,
                                         stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 30


def test_max_tokens_and_seed(server):
    kw = dict(model="tiny", prompt="To be", max_tokens=7, temperature=1.0, top_p=0.9, seed=5)
    a, b = (server.client.completions.create(**kw) for _ in range(2))
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 7


def test_the_run_directory_is_a_model_name_too(server):
    r = server.client.completions.create(model=str(server.run), prompt="A", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens == 2


# -- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, status, param, code", [
    (dict(model="gpt-4", prompt="a"), 404, "model", "model_not_found"),
    (dict(model="tiny", prompt="a", max_tokens=-1), 400, "max_tokens", None),
    (dict(model="tiny", prompt="a", max_tokens=10_000), 400, "max_tokens", "context_length_exceeded"),
    (dict(model="tiny", prompt="a", temperature=3), 400, "temperature", None),
    (dict(model="tiny", prompt="a", n=2), 400, "n", None),
    (dict(model="tiny", prompt="a", stop=["a", "b", "c", "d", "e"]), 400, "stop", None),
    (dict(model="tiny", prompt="a", logprobs=2), 400, "logprobs", "unsupported_parameter"),
    (dict(model="tiny", prompt=""), 400, "prompt", None),
])
def test_bad_completion_requests_get_openai_errors(server, call, status, param, code):
    with pytest.raises(openai.APIStatusError) as e:
        server.client.completions.create(**call)
    assert e.value.status_code == status
    err = e.value.body  # the client unwraps {"error": {...}}
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")


@pytest.mark.parametrize("messages, param", [([], "messages"), ([{"role": "wizard", "content": "hi"}], "messages")])
def test_bad_chat_requests_get_openai_errors(server, messages, param):
    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(model="tiny", messages=messages)
    assert e.value.body["param"] == param


def test_malformed_body_and_unknown_path(server):
    json_type = {"Content-Type": "application/json"}  # any other type is refused (415) before reading
    r = httpx.post(f"{server.url}/v1/completions", content=b"{not json", headers=json_type, timeout=WAIT)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(f"{server.url}/v1/embeddings", timeout=WAIT)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(f"{server.url}/v1/chat/completions", timeout=WAIT)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = httpx.post(f"{server.url}/v1/completions", content=b" " * (2 << 20), headers=json_type, timeout=WAIT)
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]


# -- concurrency --------------------------------------------------------------------------------

def test_two_concurrent_streams_both_complete(server):
    prompts = ["ROMEO:\n", "JULIET:\n"]
    out = {}

    def stream(p):
        chunks = server.client.completions.create(model="tiny", prompt=p, max_tokens=40, temperature=0, stream=True)
        out[p] = "".join(c.choices[0].text for c in chunks)

    threads = [threading.Thread(target=stream, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert out == {p: reference(server, p, 40) for p in prompts}


def _start_held_stream(server, max_tokens: int):
    """A streamed completion whose generation is held at its first decode step; returns (reply, job)."""
    GATE.clear()
    client = httpx.Client(timeout=WAIT)
    reply = client.send(client.build_request("POST", f"{server.url}/v1/completions", json=dict(
        model="tiny", prompt="HAMLET:\n", max_tokens=max_tokens, temperature=0, stream=True)), stream=True)
    assert reply.status_code == 200
    _until(lambda: server.served.worker.running, "the generation to start")
    return client, reply, server.served.worker.running[0]


def test_the_page_answers_while_a_generation_runs(server):
    client, reply, job = _start_held_stream(server, 100)
    page = httpx.get(f"{server.url}/api/gqa", params=dict(n_heads=32, n_kv_heads=8), timeout=WAIT)
    assert page.status_code == 200 and server.served.worker.running == [job]  # answered mid-generation
    assert httpx.get(f"{server.url}/", timeout=WAIT).status_code == 200
    GATE.set()
    text = "".join(reply.iter_text())
    assert "[DONE]" in text
    client.close()


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
    engine = GatedEngine.made[-1]
    before = engine.steps
    client, reply, job = _start_held_stream(server, 200)
    reply.close()
    client.close()
    _until(job.cancelled.is_set, "the server to notice the client left")
    GATE.set()
    r = server.client.completions.create(model="tiny", prompt="A", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3
    assert engine.steps - before < 199  # stopped long before its max_tokens


def test_a_client_that_leaves_a_non_streamed_request_frees_its_slot(server):
    """The client gives up while the generation is held at the gate (its read timeout), so the
    server can only learn of it by polling for the disconnect."""
    engine = GatedEngine.made[-1]
    before = engine.steps
    GATE.clear()
    left = threading.Event()

    def ask():
        try:
            httpx.post(f"{server.url}/v1/completions", json=dict(model="tiny", prompt="A", max_tokens=200),
                       timeout=httpx.Timeout(WAIT, read=0.5))
        except httpx.ReadTimeout:
            left.set()

    asker = threading.Thread(target=ask)
    asker.start()
    _until(lambda: server.served.worker.running, "the generation to start")
    job = server.served.worker.running[0]
    asker.join(WAIT)
    assert left.is_set()
    _until(job.cancelled.is_set, "the server to notice the client left")
    GATE.set()
    assert server.client.completions.create(model="tiny", prompt="B", max_tokens=2).usage.completion_tokens == 2
    assert engine.steps - before < 199


def test_a_full_queue_is_refused_with_503(server):
    client, reply, job = _start_held_stream(server, 50)
    waiting = [threading.Thread(target=lambda: server.client.completions.create(
        model="tiny", prompt="B", max_tokens=2, temperature=0)) for _ in range(2)]  # the queue holds 2
    for t in waiting:
        t.start()
    _until(lambda: server.served.worker.jobs.full(), "the queue to fill")
    with pytest.raises(openai.APIStatusError) as e:
        server.client.completions.create(model="tiny", prompt="C", max_tokens=2)
    assert e.value.status_code == 503 and e.value.body["code"] == "server_busy"
    assert int(e.value.response.headers["Retry-After"]) > 0  # when to ask again
    GATE.set()
    for t in waiting:
        t.join(WAIT)
    reply.close()
    client.close()


# -- the command --------------------------------------------------------------------------------

def test_serve_binds_this_machine_only_by_default():
    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.model is None


def test_load_served_takes_a_run_directory(server):
    served = load_served(str(server.run), max_queue=1)
    try:
        assert served.name == server.run.name and served.aliases == (str(server.run),)
        assert served.tokenizer.encode("ROMEO") == server.tok.encode("ROMEO")
    finally:
        served.worker.close()


def test_load_served_parses_a_gguf_once_when_no_engine_is_built(tmp_path, monkeypatch):
    """Without a build or --compile, the format a compiled engine would run in is not needed: the
    header (the vocabulary's parse, a large part of a start) is read once, by the load."""
    from gguf_tiny import count_gguf_opens, write_tiny_gguf
    from hf_reference import tiny_hf_model

    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2))
    opened = count_gguf_opens(monkeypatch)
    served = load_served(str(f), max_queue=1)
    served.worker.close()
    assert len(opened) == 1 and served.worker.compiled is None


def test_the_worker_uses_a_prepared_engine_only_for_requests_it_covers(server):
    """The compiled engine's place, filled by the static layout run eagerly (the same interface and
    `covers`, nothing to compile): requests within its length run on it, longer ones eagerly."""
    model = Decoder(preset("llama-2024-small", vocab_size=server.model.cfg.vocab_size, max_seq_len=1024))
    prepared = StaticEngine(model.eval())
    prepared.start(64)
    assert prepared.length < model.cfg.max_seq_len
    steps = []
    step = prepared.step_bucket  # the compiled batch engine's one-row step
    prepared.step_bucket = lambda ids, pos: (steps.append(pos), step(ids, pos))[1]
    worker = Scheduler(model, server.tok, compiled=prepared, parallel=1)  # it decodes one sequence
    ids = server.tok.encode("ROMEO:\n")

    async def ask(n: int):
        job = worker.submit(Job(ids, n, Sampling(), None, [], asyncio.get_running_loop()))
        while True:
            kind, value = await asyncio.wait_for(job.events.get(), WAIT)
            if kind != "text":
                return value

    try:
        short = asyncio.run(ask(20))
        assert len(steps) == 19 and short.tokens == generate(StaticEngine(model), ids, 20).tokens
        n = prepared.length  # with the prompt, past the prepared length: eager
        long = asyncio.run(ask(n))
        assert len(steps) == 19 and long.tokens == generate(EagerEngine(model), ids, n).tokens
    finally:
        worker.close()
