"""The body of a JSON request to the OpenAI-compatible API, read within MAX_BODY bytes.

Starlette's `request.body()` reads the whole body before anything can look at its size, so a
chunked upload (which has no Content-Length) of a gigabyte would be held in memory before a 413. Here
the Content-Length is checked first when there is one, then the stream is read chunk by chunk and
abandoned at the first byte past the limit: uvicorn closes the connection after the 413, so the
rest is never read.

Only `Content-Type: application/json` is taken. A web page can POST text/plain or form data to any
address without a CORS preflight, so a server that read those as JSON let any page the user
visits make the local server generate; a JSON content type needs a preflight, which this server
does not grant.
"""

from __future__ import annotations

from starlette.requests import Request

from llamablock.web.openai_requests import MAX_BODY, OpenAIError


def _too_big(size: str) -> OpenAIError:
    return OpenAIError(413, f"the body has {size} bytes; at most {MAX_BODY:,} are read", None, "body_too_large")


def check_json_type(request: Request) -> None:
    """Refuse (415) a request whose Content-Type is not application/json (parameters such as
    charset=utf-8 are allowed)."""
    given = request.headers.get("content-type")
    media = (given or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        shown = repr(given[:60]) if given else "none"
        raise OpenAIError(415, f"the body must be JSON sent with Content-Type: application/json (got {shown})",
                          None, "unsupported_media_type")


async def read_json_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The request's body, after its Content-Type is checked; 413 past `limit` bytes, refused from
    the Content-Length header when it says so and otherwise while the body streams in."""
    check_json_type(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise _too_big(f"{int(declared):,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_big(f"more than {limit:,}")
        chunks.append(chunk)
    return b"".join(chunks)
