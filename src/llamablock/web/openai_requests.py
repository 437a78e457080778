"""The request bodies of the OpenAI-compatible API (llamablock.web.api_openai), checked before any work.

Each field is checked against the type OpenAI documents for it, without coercion (the string "3"
is not a number, `true` is not 1), numbers for range and finiteness, and `null` means the
default, as it does for OpenAI. Fields OpenAI defines that cannot change the text (`user`,
`metadata`, ...) are ignored; fields that would change it and are not implemented are refused
unless left at their default; any other field is refused by name, as OpenAI refuses it, so that a
misspelt or vendor-specific option is never silently unread. Every refusal is an `OpenAIError`
naming its parameter, with OpenAI's error shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_STOP = 4  # OpenAI's limit
MAX_BODY = 1 << 20  # bytes of a request body: far more than any context here holds as text
RETRY_AFTER_S = 5  # seconds a client told "busy" (503) waits before asking again
ROLES = ("system", "developer", "user", "assistant")
# Fields with no effect here, refused unless left at OpenAI's default (compared with their JSON
# type too: `true` is not the 1 of best_of, and a completion's logprobs 0 asks for logprobs).
UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None,),
               "best_of": (None, 1), "tools": (None, []), "functions": (None, []), "logit_bias": (None, {}),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
               "tool_choice": (None, "none", "auto"), "function_call": (None, "none", "auto"),
               "response_format": (None, {"type": "text"}), "modalities": (None, ["text"]), "audio": (None,),
               "prediction": (None,), "reasoning_effort": (None,), "web_search_options": (None,)}
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "safety_identifier", "prompt_cache_key"}
COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stop", "seed", "stream_options",
          "logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "user"}
FIELDS = {"completions": COMMON | {"prompt", "best_of", "echo", "suffix"},
          "chat": COMMON | {"messages", "max_completion_tokens"} | (set(UNSUPPORTED) - {"best_of", "echo", "suffix"})
          | IGNORED}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, _utf8(message), _utf8(param), code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        busy = {"Retry-After": str(RETRY_AFTER_S)} if self.status == 503 else None  # when to ask again
        return JSONResponse(self.body(), status_code=self.status, headers=busy)


def _utf8(text: str | None) -> str | None:
    """`text` with any lone surrogate (JSON may escape one: "\\ud800") written as an escape, so that
    the reply can be encoded."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad(param: str, message: str, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param, code)


def show(value) -> str:
    """A value as the client sent it, cut short: for messages that say what was wrong."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


class _StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    include_usage: bool | None = None


class _Scalars(BaseModel):
    """The fields with one JSON type; prompt, messages and stop are read by hand (their messages
    say which of several shapes is expected)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    n: int | None = None
    stream: bool | None = None
    seed: Annotated[int, Field(ge=-(2**63), le=2**64 - 1)] | None = None  # what torch's generator takes
    stream_options: _StreamOptions | None = None


@dataclass
class Asked:
    """A checked request: `prompt` for a completion, `messages` ([{role, content}]) for a chat."""

    model: str
    max_tokens: int | None
    max_tokens_param: str
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    prompt: str | None = None
    messages: list[dict] | None = None


def _is_default(value, defaults: tuple) -> bool:
    return any(value is d or (type(value) is type(d) and value == d) for d in defaults)


def parse(raw: bytes, endpoint: str) -> Asked:
    """Check a request body of /v1/completions (`endpoint` "completions") or /v1/chat/completions ("chat")."""
    if len(raw) > MAX_BODY:
        raise OpenAIError(413, f"the body has {len(raw):,} bytes; at most {MAX_BODY:,} are read")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise OpenAIError(400, "the body is not valid JSON: it nests too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, or an integer past Python's digit limit
        why = "a number has more digits than are read" if "digits" in str(e) else str(e)
        raise OpenAIError(400, f"the body is not valid JSON: {why}") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, f"the body must be a JSON object, got {show(data)}")
    for name in data:
        if name not in FIELDS[endpoint]:
            raise bad(name[:60], f"Unrecognized request argument supplied: {name[:60]}", "unrecognized_argument")
    for name, defaults in UNSUPPORTED.items():
        if name in data and not _is_default(data[name], defaults):
            raise bad(name, f"{name} is not supported by this server (leave it out)", "unsupported_parameter")
    try:
        s = _Scalars.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "body"
        msg = "Input should be a JSON object" if first["type"] == "model_type" else first["msg"]
        got = f" (got {show(first['input'])})" if "input" in first and not isinstance(first["input"], dict) else ""
        raise bad(str(first["loc"][0]) if first["loc"] else None, f"{path}: {msg}{got}") from None
    if s.n not in (None, 1):
        raise bad("n", f"n: only n=1 is supported, got {s.n}")
    chat = endpoint == "chat"
    param = "max_completion_tokens" if chat and s.max_completion_tokens is not None else "max_tokens"
    asked = Asked(s.model, s.max_completion_tokens if param == "max_completion_tokens" else s.max_tokens, param,
                  1.0 if s.temperature is None else s.temperature, 1.0 if s.top_p is None else s.top_p, s.seed,
                  _stop(data.get("stop")), bool(s.stream),
                  bool(s.stream_options and s.stream_options.include_usage))
    if chat:
        asked.messages = _messages(data.get("messages"))
    else:
        asked.prompt = _prompt(data.get("prompt"), "prompt" in data)
    return asked


def _unicode(text: str, param: str, where: str) -> str:
    """`text` itself, refused when it holds a lone surrogate (JSON can escape one, "\\ud800"): no
    tokenizer reads it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad(param, f"{where} is not valid Unicode: a lone surrogate {text[e.start]!a} at character {e.start}") from None
    return text


def _stop(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else [] if stop is None else None
    if stops is None or len(stops) > MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop", f"stop: give a string or a list of at most {MAX_STOP} non-empty strings, got {show(stop)}")
    return [_unicode(s, "stop", "stop") for s in stops]


def _prompt(prompt, given: bool) -> str:
    if not given:
        raise bad("prompt", "prompt: Field required")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _unicode(prompt, "prompt", "prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise bad("prompt", "prompt: give one string (a batch of prompts is not supported)")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) for p in prompt):
        raise bad("prompt", "prompt: token ids are not accepted here; give the prompt as a string")
    raise bad("prompt", f"prompt: give a string, got {show(prompt)}")


def _messages(messages) -> list[dict]:
    if messages is None:
        raise bad("messages", "messages: Field required")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", f"messages: give a non-empty list of {{role, content}} objects, got {show(messages)}")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad("messages", f"{where}: give an object with role and content, got {show(m)}")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad("messages", f"{where}.role: give one of {', '.join(ROLES)}, got {show(role)}")
        for key, value in m.items():
            if key == "name" and not isinstance(value, str):
                raise bad("messages", f"{where}.name: give a string, got {show(value)}")
            if key not in ("role", "content", "name") and value not in (None, [], ""):
                raise bad("messages", f"{where}.{key[:40]} is not supported by this server", "unsupported_parameter")
        text = _unicode(_content(m.get("content"), where), "messages", f"{where}.content")
        out.append({"role": role, "content": text})
    return out


def _content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad("messages", f"{where}.content: give a string or a list of text parts, got {show(content)}")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind != "text":
            raise bad("messages", f"{where}.content[{j}]: parts of type {show(kind)} are not supported; only text "
                                  f"parts are read")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise bad("messages", f"{where}.content[{j}]: give a part {{\"type\": \"text\", \"text\": <string>}}, "
                                  f"got {show(part)}")
    return "".join(p["text"] for p in content)
