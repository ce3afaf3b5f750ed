"""Management parameters from the query string or a JSON body, validated by name."""

from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request

from ferry.errors import InvalidRequest
from ferry.http.request_body import read_limited
from ferry.protocols import untrusted_json

_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


class Params:
    """Typed access to request parameters; invalid values name the parameter (400)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    @classmethod
    async def read(cls, request: Request, max_body: int) -> Params:
        """The query string and JSON body's parameters; a body over ``max_body`` bytes
        is ``RequestTooLarge`` (413), found without reading more than that."""
        values: dict[str, Any] = dict(request.query_params)
        body = await read_limited(request, max_body, "the management API's body limit")
        if body.strip():
            try:
                document = untrusted_json.loads(body)
            except ValueError as exc:
                raise InvalidRequest(f"body is not valid JSON: {exc}") from exc
            if not isinstance(document, dict):
                raise InvalidRequest("JSON body must be an object of parameters")
            values.update(document)
        return cls(values)

    def text(self, name: str, *, required: bool = False, empty_ok: bool = False) -> str | None:
        """The parameter as text; ``required`` refuses it missing (and empty, unless
        ``empty_ok``)."""
        value = self._values.get(name)
        if value is None or value == "":
            if required and (value is None or not empty_ok):
                raise InvalidRequest(f"Parameter {name} is required.")
            return None
        return str(value)

    def integer(self, name: str, *, minimum: int | None = None) -> int | None:
        value = self._values.get(name)
        if value is None or value == "":
            return None
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise InvalidRequest(f"Parameter {name} must be an integer, got {value!r}") from None
        if minimum is not None and number < minimum:
            raise InvalidRequest(f"Parameter {name} must be >= {minimum}, got {number}")
        return number

    def number(self, name: str, *, minimum: float = 0.0) -> float | None:
        value = self._values.get(name)
        if value is None or value == "":
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InvalidRequest(f"Parameter {name} must be a number, got {value!r}") from None
        if not math.isfinite(number) or number < minimum:
            raise InvalidRequest(
                f"Parameter {name} must be a finite number >= {minimum:g}, got {value!r}"
            )
        return number

    def flag(self, name: str, default: bool) -> bool:
        value = self._values.get(name)
        if value is None or value == "":
            return default
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise InvalidRequest(f"Parameter {name} must be true or false, got {value!r}")
