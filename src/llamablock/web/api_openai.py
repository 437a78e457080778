"""An OpenAI-compatible API for one model, beside the page on the same port.

    GET  /v1/models                 the served model
    GET  /v1/models/{id}
    POST /v1/completions            a prompt continued             (stream: server-sent events)
    POST /v1/chat/completions       messages through the model's chat template

Fields read: model, prompt | messages, max_tokens (chat also max_completion_tokens), temperature,
top_p, seed, stop (up to 4 strings), n (1 only), stream, stream_options.include_usage. Fields
that would change the answer and are not implemented (logprobs, echo, suffix, tools, penalties)
are refused rather than ignored. Errors have OpenAI's shape, {"error": {"message", "type",
"param", "code"}}: 400 for a bad request, 404 for an unknown model or path, 405 for a known path
asked with the wrong method, 413 for a body over MAX_BODY, 503 when the queue is full, 500 when
generation itself fails. The body is validated here (pydantic), not by FastAPI,
so that every error keeps this shape.

Generation runs on the worker of llamablock.web.generation; these endpoints are `async` and only
wait for its events, so they hold no request thread. A streamed reply ends when the client
disconnects (Starlette cancels the response, which cancels the job); a non-streamed one checks
for a disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2.exceptions import TemplateError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamablock.runtime.sampling import Sampling
from llamablock.web.generation import Busy, Cancelled, Job, ServedModel

router = APIRouter()
MAX_STOP = 4  # OpenAI's limit
MAX_BODY = 1 << 20  # bytes of a request body: far more than any context here holds as text
# Fields with no effect here, refused unless left at OpenAI's default.
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None,),
               "best_of": (None, 1), "tools": (None, []), "functions": (None, []), "logit_bias": (None, {}),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0)}


RETRY_AFTER_S = 5  # seconds a client told "busy" (503) waits before asking again


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        busy = {"Retry-After": str(RETRY_AFTER_S)} if self.status == 503 else None  # when to ask again
        return JSONResponse(self.body(), status_code=self.status, headers=busy)


# Request bodies ---------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, ge=0, le=1)
    n: int = 1
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    stream_options: dict | None = None


class CompletionBody(_Body):
    prompt: str | list[str]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]


class ChatBody(_Body):
    messages: list[Message]
    max_completion_tokens: int | None = None


async def _parse(request: Request, schema: type[_Body]) -> _Body:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise OpenAIError(413, f"the body has {len(raw):,} bytes; at most {MAX_BODY:,} are read")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OpenAIError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "the body must be a JSON object")
    try:
        body = schema.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise OpenAIError(400, f"{param}: {first['msg']}", param.split(".")[0] if param else None) from None
    for name, defaults in UNSUPPORTED.items():
        if data.get(name) not in defaults:
            raise OpenAIError(400, f"{name} is not supported by this server", name, "unsupported_parameter")
    if body.n != 1:
        raise OpenAIError(400, f"n: only n=1 is supported, got {body.n}", "n")
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise OpenAIError(400, f"stop: give at most {MAX_STOP} non-empty strings", "stop")
    body.stop = stops
    return body


def _served(request: Request, name: str | None) -> ServedModel:
    served: ServedModel | None = request.app.state.served
    if served is None or (name is not None and name != served.name and name not in served.aliases):
        known = f"this server serves {served.name!r}" if served else "this server serves no model (see --model)"
        raise OpenAIError(404, f"The model {name!r} does not exist; {known}", "model", "model_not_found")
    return served


def _check_lengths(served: ServedModel, n_prompt: int, max_tokens: int | None, param: str) -> int:
    ctx = served.model.cfg.max_seq_len
    if n_prompt == 0:
        raise OpenAIError(400, "the prompt is empty (no tokens after tokenizing)", "prompt")
    if max_tokens is not None and max_tokens < 1:
        raise OpenAIError(400, f"{param} must be at least 1, got {max_tokens}", param)
    if n_prompt >= ctx or (max_tokens is not None and n_prompt + max_tokens > ctx):
        asked = f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} in the completion)" \
            if max_tokens is not None else f"{n_prompt} tokens in the prompt"
        raise OpenAIError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                          f"{asked}. Shorten the prompt or lower {param}.", param, "context_length_exceeded")
    return max_tokens if max_tokens is not None else ctx - n_prompt


def _job(served: ServedModel, ids: list[int], max_tokens: int, body: _Body) -> Job:
    greedy = body.temperature == 0 or body.top_p == 0
    sampling = Sampling(0.0 if greedy else body.temperature, 0, 1.0 if greedy else body.top_p)
    job = Job(ids, max_tokens, sampling, body.seed, body.stop, asyncio.get_running_loop())
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


async def _answer(request: Request, served: ServedModel, ids: list[int], max_tokens: int, body: _Body, chat: bool):
    job = _job(served, ids, max_tokens, body)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": served.name}
    if body.stream:
        return StreamingResponse(_stream(job, head, chat, len(ids), body), media_type="text/event-stream",
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


async def _stream(job: Job, head: dict, chat: bool, n_prompt: int, body: _Body):
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
                if (body.stream_options or {}).get("include_usage"):
                    yield f"data: {json.dumps({**head, 'choices': [], 'usage': _usage(n_prompt, value)})}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:  # also on a disconnect: Starlette cancels this generator, and the worker drops the job
        job.cancelled.set()


# Endpoints --------------------------------------------------------------------------------------
@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    served = request.app.state.served
    data = [] if served is None else [{"id": served.name, "object": "model", "created": served.created,
                                       "owned_by": "llamablock"}]
    return {"object": "list", "data": data}


@router.get("/v1/models/{name:path}")
async def get_model(name: str, request: Request):
    try:
        served = _served(request, name)
    except OpenAIError as e:
        return e.response()
    return {"id": served.name, "object": "model", "created": served.created, "owned_by": "llamablock"}


@router.post("/v1/completions")
async def completions(request: Request):
    try:
        body = await _parse(request, CompletionBody)
        served = _served(request, body.model)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise OpenAIError(400, "prompt: give one string (a batch of prompts is not supported)", "prompt")
            prompt = prompt[0]
        ids = served.tokenizer.encode(prompt)
        max_tokens = _check_lengths(served, len(ids), 16 if body.max_tokens is None else body.max_tokens, "max_tokens")
        return await _answer(request, served, ids, max_tokens, body, chat=False)
    except OpenAIError as e:
        return e.response()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    try:
        body = await _parse(request, ChatBody)
        served = _served(request, body.model)
        if not body.messages:
            raise OpenAIError(400, "messages: give at least one message", "messages")
        messages = [{"role": m.role, "content": m.content if isinstance(m.content, str)
                     else "".join(p.text for p in m.content)} for m in body.messages]
        try:
            text = served.tokenizer.apply_chat_template(messages)
        except (ValueError, TemplateError) as e:
            raise OpenAIError(400, f"messages: {e}", "messages") from None
        ids = served.tokenizer.encode(text, add_special_tokens=False)
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        max_tokens = _check_lengths(served, len(ids), asked, param)
        return await _answer(request, served, ids, max_tokens, body, chat=True)
    except OpenAIError as e:
        return e.response()


@router.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
async def unknown(rest: str, request: Request):
    if rest in ("completions", "chat/completions", "models"):
        allowed = "GET" if rest == "models" else "POST"
        return OpenAIError(405, f"/v1/{rest} takes {allowed}, not {request.method}", None,
                           "method_not_allowed").response()
    return OpenAIError(404, f"no such endpoint: /v1/{rest[:60]}", None, "not_found").response()

