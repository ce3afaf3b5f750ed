"""Reading a request body into ``InputPart``s, within ``max_request_size``."""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from ferry.errors import InvalidInput, RequestTooLarge
from ferry.service.types import InputPart

_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


async def read_limited(request: Request, limit: int, limit_name: str = "max_request_size") -> bytes:
    """The whole body, streamed: ``RequestTooLarge`` as soon as it passes ``limit`` bytes,
    or before reading any of it when its Content-Length says it will."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body of {declared} bytes exceeds {limit_name} {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"request body exceeds {limit_name} {limit}")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_parts(request: Request, limit: int) -> list[InputPart]:
    """The raw body as one ``body`` part, or one part per form field."""
    content_type = request.headers.get("content-type", "application/octet-stream")
    body = await read_limited(request, limit)
    if not content_type.lower().startswith(_FORM_TYPES):
        return [InputPart("body", content_type, body)]
    request._body = body  # let Starlette's form parser reuse the body we already read
    try:
        form = await request.form(max_files=1000, max_fields=1000)
    except Exception as exc:  # python-multipart raises several unrelated types
        # Inside a Starlette app (the routes, not the predictions' fast path) its parse
        # errors come wrapped in an HTTPException, whose text would add "400: ".
        reason = exc.detail if isinstance(exc, HTTPException) else exc
        raise InvalidInput(f"malformed form body: {reason}") from exc
    parts = []
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            data = await value.read()
            parts.append(InputPart(name, value.content_type or "application/octet-stream", data))
        else:
            parts.append(InputPart(name, "text/plain", value.encode()))
    await form.close()
    return parts
