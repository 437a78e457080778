"""Property tests (hypothesis) of the OpenAI-compatible API's request bodies, on a tiny served model.

Bodies mix valid values with wrong types, out-of-range and non-finite numbers (sent as JSON's
NaN and Infinity), lone surrogates, missing, unsupported and unknown fields, malformed messages
and bytes that are not JSON. The oracle is written here, independently of the server's checks:
a 200 is a well-formed answer to a body whose every field is valid, and a 4xx is OpenAI's error
shape naming a parameter that is in fact wrong (or required and missing), never a 500. Then the
named regressions of what the fuzzing found. Bodies are small and the model tiny, so each case
takes milliseconds.
"""

from __future__ import annotations

import json
import math
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llamablock.io.loading import load_model_and_tokenizer
from llamablock.web.app import create_app
from llamablock.web.generation import ServedModel
from llamablock.web.scheduler import Scheduler

C, CHAT = "/v1/completions", "/v1/chat/completions"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
CTX = 64  # the tiny model's context
JSON = {"Content-Type": "application/json"}  # the only type the API reads (415 otherwise)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    f = tmp_path_factory.mktemp("openai") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=CTX),
                    extra_kv={"tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})
    model, tok = load_model_and_tokenizer(f)
    served = ServedModel("tiny", model, tok, Scheduler(model, tok, max_queue=4), 0, (str(f),))
    with TestClient(create_app(served=served)) as c:  # the lifespan stops the worker
        yield c


# -- the oracle: which values are valid, written from OpenAI's reference and the server's docs ---

def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v, lo, hi) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v) and lo <= v <= hi


def _text(v) -> bool:
    return isinstance(v, str) and not any(0xD800 <= ord(c) <= 0xDFFF for c in v)


def _stop_ok(v) -> bool:
    stops = [v] if isinstance(v, str) else v if isinstance(v, list) else None
    return v is None or (stops is not None and len(stops) <= 4 and all(_text(s) and s for s in stops))


def _messages_ok(v) -> bool:
    def content_ok(c):
        return _text(c) or (isinstance(c, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and _text(p.get("text")) for p in c))
    return isinstance(v, list) and bool(v) and all(
        isinstance(m, dict) and m.get("role") in ("system", "developer", "user", "assistant")
        and content_ok(m.get("content")) and isinstance(m.get("name", ""), str)
        and all(m[k] in (None, [], "") for k in m if k not in ("role", "content", "name")) for m in v)


def _default(*values):
    return lambda v: any(v is d or (type(v) is type(d) and v == d) for d in values)


VALID = {
    "model": lambda v: isinstance(v, str), "max_tokens": lambda v: v is None or _int(v),
    "max_completion_tokens": lambda v: v is None or _int(v),
    "temperature": lambda v: v is None or _number(v, 0, 2), "top_p": lambda v: v is None or _number(v, 0, 1),
    "n": lambda v: v is None or (_int(v) and v == 1), "stream": lambda v: v is None or isinstance(v, bool),
    "seed": lambda v: v is None or (_int(v) and -(2**63) <= v < 2**64), "stop": _stop_ok,
    "stream_options": lambda v: v is None or (isinstance(v, dict) and v.get("include_usage") in (None, True, False)
                                              and not _int(v.get("include_usage"))),
    "prompt": lambda v: _text(v) or (isinstance(v, list) and len(v) == 1 and _text(v[0])),
    "messages": _messages_ok, "user": lambda v: True, "metadata": lambda v: True,
    "logprobs": _default(None, False), "presence_penalty": _default(None, 0, 0.0),
    "frequency_penalty": _default(None, 0, 0.0), "best_of": _default(None, 1), "echo": _default(None, False),
    "response_format": _default(None, {"type": "text"}), "tool_choice": _default(None, "none", "auto"),
    "suffix": _default(None),
}
ENDPOINT_FIELDS = {"/v1/completions": {"prompt", "best_of", "echo", "suffix"},
                   "/v1/chat/completions": {"messages", "max_completion_tokens", "metadata", "response_format",
                                            "tool_choice"}}
REQUIRED = {"/v1/completions": "prompt", "/v1/chat/completions": "messages"}


def own_fields(path: str) -> set[str]:
    """The fields `path` defines (valid or not in value): all but the other endpoint's own."""
    return set(VALID) - (set().union(*ENDPOINT_FIELDS.values()) - ENDPOINT_FIELDS[path])


# -- bodies -----------------------------------------------------------------------------------

TEXT = st.text(st.one_of(st.characters(max_codepoint=0x7F), st.sampled_from(["\ud800", "\udfff", "é", "\x00"])),
               max_size=12)
ANY = st.one_of(st.none(), st.booleans(), st.integers(-10, 100), st.integers(-(2**70), 2**70),
                st.floats(allow_nan=True, allow_infinity=True), TEXT, st.lists(st.integers(0, 5), max_size=3),
                st.lists(TEXT, max_size=6), st.dictionaries(st.sampled_from(["type", "include_usage", "x"]),
                                                            st.booleans() | TEXT, max_size=2))
WORD = st.text("abc XYZ\n", min_size=1, max_size=16)  # each character one token of the tiny vocabulary
GOOD = {
    "max_tokens": st.integers(1, 6), "max_completion_tokens": st.integers(1, 6), "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1), "n": st.just(1), "stream": st.booleans(), "seed": st.integers(-(2**63), 2**64 - 1),
    "stop": st.one_of(st.text("abc", min_size=1, max_size=3), st.lists(st.text("abc", min_size=1, max_size=3),
                                                                        max_size=4)),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}), "user": TEXT,
    "metadata": st.just({"k": "v"}), "logprobs": st.sampled_from([None, False]),
    "presence_penalty": st.sampled_from([0, 0.0]), "frequency_penalty": st.sampled_from([None, 0]),
    "best_of": st.just(1), "echo": st.just(False), "suffix": st.none(), "response_format": st.just({"type": "text"}),
    "tool_choice": st.sampled_from(["none", "auto"]), "prompt": st.one_of(WORD, st.lists(WORD, min_size=1, max_size=1)),
    "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]),
         "content": st.one_of(WORD, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": WORD}),
                                              min_size=1, max_size=2))}), min_size=1, max_size=2),
}
PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | ANY}, optional={"text": TEXT | ANY})
BAD_MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "tool", "wizard"]) | ANY, "content": st.one_of(TEXT, st.lists(PART, max_size=2),
                                                                                     ANY)},
    optional={"name": TEXT | ANY, "tool_calls": ANY}), max_size=3)


def bodies(path: str, only_valid: bool = False):
    """Bodies for `path`: each field valid, or (unless `only_valid`) often not, unknown fields added
    and required ones dropped."""
    fields = sorted(set(GOOD) & own_fields(path) - {"model", REQUIRED[path]})
    mixed = {k: GOOD[k] if only_valid else st.one_of(GOOD[k], GOOD[k], ANY) for k in fields}
    need = GOOD[REQUIRED[path]]
    if not only_valid:
        need = st.one_of(need, need, BAD_MESSAGES if path.endswith("chat/completions") else ANY)
    model = st.just("tiny") if only_valid else st.sampled_from(["tiny", "tiny", "tiny", "gpt-4"]) | ANY
    base = st.fixed_dictionaries({"model": model, REQUIRED[path]: need}, optional=mixed)
    if only_valid:
        return base
    extra = st.dictionaries(st.sampled_from(UNKNOWN), ANY, max_size=1)
    return st.tuples(base, extra, st.sets(st.sampled_from(["model", REQUIRED[path]]), max_size=1)).map(
        lambda t: {k: v for k, v in {**t[0], **t[1]}.items() if k not in t[2]})


UNKNOWN = ["top_k", "foo", "\ud800", "suffix"]  # suffix: a completion's field, unknown to a chat


def one_wrong(path: str):
    """(body, field): a valid body with one field given any value, or dropped (value None)."""
    fields = sorted(own_fields(path) | set(UNKNOWN))
    values = st.one_of(st.sampled_from(NEAR_MISSES), ANY, *([BAD_MESSAGES] if path == CHAT else []))
    return st.tuples(bodies(path, only_valid=True), st.sampled_from(fields), values, st.integers(0, 9)).map(
        lambda t: ({**{k: v for k, v in t[0].items() if k != t[1]}, **({} if t[3] == 0 else {t[1]: t[2]})}, t[1]))


# -- checks ---------------------------------------------------------------------------------------

def post(client, path: str, body: dict):
    return client.post(path, content=json.dumps(body, allow_nan=True).encode(), headers=JSON)


def check_answer(reply, path: str, body: dict) -> None:
    """A 200: every field valid, and an answer of OpenAI's shape, its counts and stops honoured."""
    bad = [k for k in body if k not in own_fields(path) or not VALID[k](body[k])]
    assert not bad, f"accepted invalid fields {bad}"
    chat = path.endswith("chat/completions")
    if body.get("stream"):
        events = [line[len("data: "):] for line in reply.text.split("\n\n") if line]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join((c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
                       for c in chunks if c["choices"])
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        usage = chunks[-1].get("usage") if (body.get("stream_options") or {}).get("include_usage") else None
    else:
        answer = reply.json()
        assert answer["object"] == ("chat.completion" if chat else "text_completion") and answer["model"] == "tiny"
        (choice,) = answer["choices"]
        text, finish, usage = choice["message"]["content"] if chat else choice["text"], choice["finish_reason"], \
            answer["usage"]
    assert isinstance(text, str) and finish in ("length", "stop")
    if usage is not None:
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] <= CTX
        limit = body.get("max_completion_tokens") if chat else None
        limit = limit if limit is not None else body.get("max_tokens")
        assert limit is None or usage["completion_tokens"] <= limit
    stops = [body["stop"]] if isinstance(body.get("stop"), str) else body.get("stop") or []
    assert not any(s in text for s in stops)


def check_refusal(reply, path: str, body: dict | None) -> None:
    """A 4xx: OpenAI's error shape; for a JSON object, the parameter it names is wrong, missing or unknown."""
    err = reply.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert isinstance(err["message"], str) and err["message"]
    if body is None:
        return
    param = err["param"]
    assert param is not None and param in err["message"], err
    if err["code"] == "unrecognized_argument":
        assert param not in own_fields(path), err
    elif param not in body:
        assert param in ("model", REQUIRED[path]) or err["code"] == "context_length_exceeded", err
    elif reply.status_code == 404:
        assert param == "model" and body["model"] != "tiny"
    elif param in (REQUIRED[path], "max_tokens", "max_completion_tokens") and VALID[param](body[param]):
        # valid in form; refused for its length (an empty prompt, past the context, below 1)
        assert err["code"] == "context_length_exceeded" or "empty" in err["message"] or "at least 1" in err["message"]
    else:
        assert not VALID[param](body[param]), f"{param}={body[param]!r} refused: {err['message']}"


@pytest.mark.parametrize("path", [C, CHAT])
@pytest.mark.parametrize("kind", ["one-field-wrong", "any-fields-wrong"])
def test_fuzzed_bodies_are_answered_or_refused_by_name(client, path, kind):
    """One field given any value (the refusal names that field), or any fields at once."""
    @FAST
    @given(one_wrong(path) if kind == "one-field-wrong" else bodies(path).map(lambda b: (b, None)))
    def run(case):
        body, field = case
        reply = post(client, path, body)
        assert reply.status_code in (200, 400, 404), (body, reply.text[:300])
        (check_answer if reply.status_code == 200 else check_refusal)(reply, path, body)
        err = reply.json()["error"] if reply.status_code != 200 else None
        if field is not None and err and err["code"] != "context_length_exceeded":
            assert err["param"] in (field, field.encode("ascii", "backslashreplace").decode())

    run()


NEAR_MISSES = [-1, -0.0, 0, 1e-300, 0.5, 1, 1.0, 1.5, 2, 2.000001, 3, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63),
               -(2**63) - 1, math.nan, math.inf, True, False, "1", "", "a\ud800", "none", None, [], ["a"], [1], {},
               ["a", "b", "c", "d", "e"], {"include_usage": True}, {"type": "text"}, [{"role": "user", "content": "a"}],
               [{"role": "user", "content": [{"type": "image_url"}]}]]


@pytest.mark.parametrize("path", [C, CHAT])
def test_every_field_with_every_near_miss_value(client, path):
    """Each field of a valid body given each boundary or wrong-typed value, not left to chance:
    accepted exactly when valid, and a value that is not valid is refused by the field's name."""
    base = {"model": "tiny", "max_tokens": 2, **({"messages": [{"role": "user", "content": "abc"}]}
                                                  if path == CHAT else {"prompt": "abc"})}
    for field in sorted(own_fields(path)):
        for value in NEAR_MISSES:
            body = {**base, field: value}
            reply = post(client, path, body)
            assert reply.status_code in (200, 400, 404), (field, value, reply.text[:200])
            (check_answer if reply.status_code == 200 else check_refusal)(reply, path, body)
            if not VALID[field](value):
                assert reply.json()["error"]["param"] == field, (field, value, reply.text[:200])


@pytest.mark.parametrize("path", [C, CHAT])
def test_valid_bodies_get_a_well_formed_answer(client, path):
    @settings(FAST, max_examples=30)
    @given(bodies(path, only_valid=True))
    def run(body):
        reply = post(client, path, body)
        assert reply.status_code == 200, (body, reply.text[:300])
        check_answer(reply, path, body)

    run()


@FAST
@given(st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_bytes_that_are_not_a_request_are_refused(client, raw):
    reply = client.post("/v1/completions", content=raw, headers=JSON)
    assert reply.status_code == 400, (raw, reply.text[:300])
    check_refusal(reply, "/v1/completions", None)


@FAST
@given(TEXT)
@example("a\nb")  # a newline: no route's path parameter matches it
def test_model_ids_are_found_or_not_found(client, name):
    reply = client.get("/v1/models/" + quote(name.encode("utf-8", "surrogatepass"), safe=""))
    assert reply.status_code in (200, 404), reply.text[:300]
    if reply.status_code == 404:
        check_refusal(reply, "/v1/completions", None)


# -- what the fuzzing found: named regressions --------------------------------------------------

ASK = {"model": "tiny", "prompt": "abc", "max_tokens": 2}
SAY = {"model": "tiny", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 2}


@pytest.mark.parametrize("path, body, status, param", [
    pytest.param(C, {**ASK, "seed": 2**64}, 400, "seed", id="seed-past-uint64-was-500"),
    pytest.param(C, {**ASK, "seed": -(2**63) - 1}, 400, "seed", id="seed-below-int64-was-500"),
    pytest.param(C, {**ASK, "temperature": 1e-300}, 200, None, id="temperature-below-float32-was-500"),
    pytest.param(C, b'{"model": "tiny", "prompt": "a\\ud800"}', 400, "prompt", id="lone-surrogate-prompt-was-500"),
    pytest.param(CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}', 400, "messages",
                 id="lone-surrogate-message-was-500"),
    pytest.param(C, b"[" * 100_000, 400, None, id="deep-nesting-was-500"),
    pytest.param(C, b'{"model": "tiny", "prompt": "a", "seed": 1' + b"0" * 5000 + b"}", 400, None,
                 id="integer-past-digit-limit-was-500"),
    pytest.param(C, {**ASK, "temperature": True}, 400, "temperature", id="true-temperature-was-read-as-1"),
    pytest.param(C, {**ASK, "max_tokens": "2"}, 400, "max_tokens", id="string-max-tokens-was-read-as-2"),
    pytest.param(C, {**ASK, "presence_penalty": False}, 400, "presence_penalty", id="false-penalty-was-read-as-0"),
    pytest.param(C, {**ASK, "logprobs": 0}, 400, "logprobs", id="logprobs-0-was-ignored"),
    pytest.param(C, {**ASK, "stream_options": {"include_usage": "yes"}}, 400, "stream_options",
                 id="string-include-usage-was-read-as-true"),
    pytest.param(C, {**ASK, "top_k": 5}, 400, "top_k", id="unknown-field-was-ignored"),
    pytest.param(CHAT, {**SAY, "response_format": {"type": "json_object"}}, 400, "response_format",
                 id="json-mode-was-ignored"),
    pytest.param(CHAT, {**SAY, "temperature": None, "top_p": None, "n": None, "stream": None}, 200, None,
                 id="null-means-default-was-400"),
    pytest.param(CHAT, {**SAY, "messages": [{"role": "user", "content": ""}]}, 400, "messages",
                 id="empty-chat-named-prompt"),
    pytest.param(CHAT, {**SAY, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
                 400, "messages", id="image-part-said-content-should-be-a-string"),
    pytest.param(C, {**ASK, "prompt": [[1, 2]]}, 400, "prompt", id="token-id-prompt-said-prompt.str"),
])
def test_what_the_fuzzing_found(client, path, body, status, param):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = client.post(path, content=raw, headers=JSON)
    assert reply.status_code == status, reply.text[:300]
    if status == 200:
        check_answer(reply, path, body)
    else:
        check_refusal(reply, path, None)
        assert reply.json()["error"]["param"] == param and (param is None or param in reply.json()["error"]["message"])


def test_a_path_no_route_matches_is_an_openai_404(client):
    """A path parameter does not match a newline: /v1/models/<newline>x got FastAPI's {"detail"}."""
    reply = client.get("/v1/models/%0Ax")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
    assert client.get("/api/%0Ax").json()["error"] == "not found"
