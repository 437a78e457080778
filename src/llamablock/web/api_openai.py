"""An OpenAI-compatible API for one model, beside the page on the same port.

    GET  /v1/models                 the served model, with its context in force (max_model_len)
    GET  /v1/models/{id}
    POST /v1/completions            a prompt continued             (stream: server-sent events)
    POST /v1/chat/completions       messages through the model's chat template

Fields read: model, prompt | messages, max_tokens (chat also max_completion_tokens), temperature,
top_p, seed, stop (up to 4 strings), n (1 only), stream, stream_options.include_usage. Fields
that would change the answer and are not implemented (logprobs, echo, suffix, tools, penalties)
are refused rather than ignored, and so is a field OpenAI does not define. Errors have OpenAI's
shape, {"error": {"message", "type", "param", "code"}}: 400 for a bad request, 404 for an unknown
model or path, 405 for a known path asked with the wrong method, 413 for a body over MAX_BODY,
415 for a body not sent as application/json, 503 when the queue is full, 500 when generation
itself fails. The body is checked (each field's JSON type, range and finiteness) by
llamablock.web.openai_requests, not by FastAPI, so that every error keeps this shape.

The body is read within MAX_BODY bytes as it streams, and only as JSON (llamablock.web.bodies:
415 for another Content-Type, which a web page could send without a CORS preflight). Parsing,
templating and tokenizing a request run on a worker thread of their own (`PREPARE`), never on the
event loop, so a flood of large prompts does not hold up the page or /v1/models; a prompt too
long for the context even at the vocabulary's longest token is refused before it is tokenized.
The context is the served model's config's, with serve's --ctx-size and RoPE scaling applied: a
prompt and max_tokens that together exceed it get OpenAI's 400 `context_length_exceeded` (its
message as OpenAI words it), never a shortened prompt or reply. A chat without max_tokens may
run to the end of the context, as OpenAI's does; a completion's max_tokens defaults to 16.

Generation runs on the scheduler of llamablock.web.scheduler (several requests decoded as one
batch); these endpoints are `async` and only wait for their job's events, so they hold no
request thread. A streamed reply ends when the client
disconnects (Starlette cancels the response, which cancels the job); a non-streamed one checks
for a disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import anyio
from anyio.to_thread import run_sync
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2.exceptions import TemplateError

from llamablock.runtime.sampling import Sampling
from llamablock.web.bodies import read_json_body
from llamablock.web.generation import ServedModel
from llamablock.web.openai_requests import Asked, OpenAIError, bad, parse, show
from llamablock.web.scheduler import Busy, Cancelled, Job

router = APIRouter()
# Threads that parse, template and tokenize requests: a few, apart from the pool that runs the
# page's synchronous endpoints, so that a flood of large prompts leaves that pool free.
PREPARE = 2


def _prepare_limiter(request: Request) -> anyio.CapacityLimiter:
    """The app's limiter of preparing threads, made on first use (inside its event loop)."""
    state = request.app.state
    if getattr(state, "prepare_limiter", None) is None:
        state.prepare_limiter = anyio.CapacityLimiter(PREPARE)
    return state.prepare_limiter


def _served(request: Request, name: str | None) -> ServedModel:
    served: ServedModel | None = request.app.state.served
    if served is None or (name is not None and name != served.name and name not in served.aliases):
        known = f"this server serves {served.name!r}" if served else "this server serves no model (see --model)"
        raise OpenAIError(404, f"The model {show(name)} does not exist; {known}", "model", "model_not_found")
    return served


def _check_lengths(served: ServedModel, n_prompt: int, max_tokens: int | None, param: str, source: str) -> int:
    """The number of tokens to generate; `param` names the length asked for, `source` the prompt's field."""
    ctx = served.model.cfg.max_seq_len
    if n_prompt == 0:
        raise bad(source, f"{source}: the prompt is empty (no tokens after tokenizing)")
    if max_tokens is not None and max_tokens < 1:
        raise bad(param, f"{param} must be at least 1, got {max_tokens}")
    if n_prompt >= ctx:
        raise bad(source, f"This model's maximum context length is {ctx} tokens. However, {n_prompt} tokens are "
                  f"in the {source}. Shorten the {source}.", "context_length_exceeded")
    if max_tokens is not None and n_prompt + max_tokens > ctx:
        raise bad(param, f"This model's maximum context length is {ctx} tokens. However, you requested "
                  f"{n_prompt + max_tokens} tokens ({n_prompt} in the {source}, {max_tokens} in the completion). "
                  f"Shorten the {source} or lower {param}.", "context_length_exceeded")
    return max_tokens if max_tokens is not None else ctx - n_prompt


def _job(served: ServedModel, ids: list[int], max_tokens: int, asked: Asked) -> Job:
    greedy = asked.temperature == 0 or asked.top_p == 0
    sampling = Sampling(0.0 if greedy else asked.temperature, 0, 1.0 if greedy else asked.top_p)
    job = Job(ids, max_tokens, sampling, asked.seed, asked.stop, asyncio.get_running_loop())
    try:
        return served.worker.submit(job)
    except Busy as e:
        raise OpenAIError(503, f"the server is busy: {e}", None, "server_busy") from None


async def _next_event(job: Job, request: Request | None, poll_s: float = 0.25):
    """The job's next event; with `request`, cancel the job when its client has gone away."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), poll_s)
        except asyncio.TimeoutError:
            if request is not None and await request.is_disconnected():
                job.cancelled.set()
                raise Cancelled from None


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _usage(n_prompt: int, g) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": len(g.tokens), "total_tokens": n_prompt + len(g.tokens)}


async def _answer(request: Request, served: ServedModel, ids: list[int], max_tokens: int, asked: Asked, chat: bool):
    job = _job(served, ids, max_tokens, asked)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": served.name}
    if asked.stream:
        return StreamingResponse(_stream(job, head, chat, len(ids), asked.include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    try:
        while True:
            kind, value = await _next_event(job, request)
            if kind == "error":
                raise OpenAIError(500, f"generation failed: {type(value).__name__}: {value}")
            if kind == "done":
                break
    except Cancelled:  # the client has gone: nobody reads this reply
        return Response(status_code=499)
    except asyncio.CancelledError:
        job.cancelled.set()
        raise
    text = value.text or ""
    choice = {"index": 0, "finish_reason": _finish(value.stop_reason), "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    return JSONResponse({**head, "choices": [choice], "usage": _usage(len(ids), value)})


async def _stream(job: Job, head: dict, chat: bool, n_prompt: int, include_usage: bool):
    head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}

    def chunk(piece: dict, finish: str | None = None) -> str:
        choice = {"index": 0, "finish_reason": finish, "logprobs": None}
        choice.update({"delta": piece} if chat else {"text": piece.get("content", "")})
        return f"data: {json.dumps({**head, 'choices': [choice]}, ensure_ascii=False)}\n\n"

    try:
        if chat:
            yield chunk({"role": "assistant", "content": ""})
        while True:
            kind, value = await job.events.get()
            if kind == "text":
                yield chunk({"content": value})
            elif kind == "error":
                err = OpenAIError(500, f"generation failed: {type(value).__name__}: {value}")
                yield f"data: {json.dumps(err.body())}\n\n"
                break
            else:
                yield chunk({}, _finish(value.stop_reason))
                if include_usage:
                    yield f"data: {json.dumps({**head, 'choices': [], 'usage': _usage(n_prompt, value)})}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:  # also on a disconnect: Starlette cancels this generator, and the worker drops the job
        job.cancelled.set()


# Endpoints --------------------------------------------------------------------------------------
def _card(served: ServedModel) -> dict:
    """The model as /v1/models lists it: OpenAI's four fields, and the context in force (what
    serve's --ctx-size and RoPE-scaling flags made it) as vLLM names it (`max_model_len`) and in
    llama-server's `meta` (`n_ctx`), with the RoPE scaling that reaches it."""
    cfg = served.model.cfg
    return {"id": served.name, "object": "model", "created": served.created, "owned_by": "llamablock",
            "max_model_len": cfg.max_seq_len,
            "meta": {"n_ctx": cfg.max_seq_len, "n_vocab": cfg.vocab_size, "rope_scaling": cfg.rope_scaling}}


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    served = request.app.state.served
    return {"object": "list", "data": [] if served is None else [_card(served)]}


@router.get("/v1/models/{name:path}")
async def get_model(name: str, request: Request):
    try:
        served = _served(request, name)
    except OpenAIError as e:
        return e.response()
    return _card(served)


def _prepare_completion(request: Request, raw: bytes):
    """On a worker thread: the checked request, its prompt's ids and the tokens to generate."""
    asked = parse(raw, "completions")
    served = _served(request, asked.model)
    _fits(served, asked.prompt, "prompt")
    ids = served.tokenizer.encode(asked.prompt)
    max_tokens = _check_lengths(served, len(ids), 16 if asked.max_tokens is None else asked.max_tokens,
                                "max_tokens", "prompt")
    return asked, served, ids, max_tokens


def _prepare_chat(request: Request, raw: bytes):
    """On a worker thread: the checked request, its templated messages' ids and the tokens to generate."""
    asked = parse(raw, "chat")
    served = _served(request, asked.model)
    try:
        text = served.tokenizer.apply_chat_template(asked.messages, isolated=True)  # time-limited child
    except (ValueError, TemplateError) as e:
        raise bad("messages", f"messages: {e}") from None
    _fits(served, text, "messages")  # on the template's text: a template may leave messages out
    ids = served.tokenizer.encode(text, add_special_tokens=False)
    max_tokens = _check_lengths(served, len(ids), asked.max_tokens, asked.max_tokens_param, "messages")
    return asked, served, ids, max_tokens


def _fits(served: ServedModel, text: str, source: str) -> None:
    """Refuse, before tokenizing it, a text longer than the context can hold even if every token
    were the vocabulary's longest (a token covers at most that many characters)."""
    ctx = served.model.cfg.max_seq_len
    longest = getattr(served.tokenizer, "max_token_chars", None)
    if longest and len(text) > ctx * longest:
        raise bad(source, f"This model's maximum context length is {ctx} tokens. However, the {source} has "
                  f"{len(text):,} characters, more than {ctx} tokens of at most {longest} characters each can "
                  f"hold. Shorten the {source}.", "context_length_exceeded")


async def _prepared(request: Request, prepare):
    raw = await read_json_body(request)  # before `preparing`: a slow upload must not hold prefills
    served = request.app.state.served
    with served.worker.preparing() if served is not None else contextlib.nullcontext():
        return await run_sync(prepare, request, raw, limiter=_prepare_limiter(request))


@router.post("/v1/completions")
async def completions(request: Request):
    try:
        asked, served, ids, max_tokens = await _prepared(request, _prepare_completion)
        return await _answer(request, served, ids, max_tokens, asked, chat=False)
    except OpenAIError as e:
        return e.response()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    try:
        asked, served, ids, max_tokens = await _prepared(request, _prepare_chat)
        return await _answer(request, served, ids, max_tokens, asked, chat=True)
    except OpenAIError as e:
        return e.response()


@router.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
async def unknown(rest: str, request: Request):
    if rest in ("completions", "chat/completions", "models"):
        allowed = "GET" if rest == "models" else "POST"
        return OpenAIError(405, f"/v1/{rest} takes {allowed}, not {request.method}", None,
                           "method_not_allowed").response()
    return OpenAIError(404, f"no such endpoint: /v1/{rest[:60]}", None, "not_found").response()

