"""What a request's headers ask of the service: its id, its deadline and its priority."""

from __future__ import annotations

import math

from ferry.errors import InvalidInput
from ferry.scheduling.jobs import next_request_id

MAX_REQUEST_ID = 128
"""Longest ``x-request-id`` a client may choose; a longer one is replaced by Ferry's."""

DEADLINE_HEADER = "x-ferry-deadline-ms"
"""A request's time budget in milliseconds from its arrival: past it, or when its batch
cannot finish within it, it is answered ``DeadlineExceeded`` instead of being run."""

PRIORITY_HEADER = "x-ferry-priority"
"""A request's priority, an integer from -100 to 100 (default 0): queued requests of a
higher priority go into the next batch first."""
PRIORITY_RANGE = range(-100, 101)


def _header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name), None)


def deadline_budget(headers: dict[str, str]) -> float | None:
    """Seconds the request may take, from ``DEADLINE_HEADER``; ``InvalidInput`` if bad."""
    value = _header(headers, DEADLINE_HEADER)
    if value is None:
        return None
    try:
        milliseconds = float(value)
    except ValueError:
        milliseconds = math.nan
    if not milliseconds > 0 or math.isinf(milliseconds):
        raise InvalidInput(f"{DEADLINE_HEADER} must be a positive number of milliseconds")
    return milliseconds / 1000


def request_priority(headers: dict[str, str]) -> int:
    """The priority ``PRIORITY_HEADER`` asks for (0 without it); ``InvalidInput`` if bad."""
    value = _header(headers, PRIORITY_HEADER)
    if value is None:
        return 0
    try:
        priority = int(value.strip())
    except ValueError:
        priority = PRIORITY_RANGE.stop
    if priority not in PRIORITY_RANGE:
        raise InvalidInput(f"{PRIORITY_HEADER} must be an integer from -100 to 100")
    return priority


class RequestIds:
    """The ids requests run under. Ids key the jobs a worker holds, so a client's
    ``x-request-id`` is used only while no other request in flight has it."""

    def __init__(self) -> None:
        self._in_flight: set[str] = set()
        """Clients' ``x-request-id`` values in flight."""

    def choose(self, wanted: str) -> str:
        """The client's id when it is usable: at most 128 visible ASCII characters, not
        in flight already and not of the generated form (``r`` and digits). Otherwise a
        generated one."""
        usable = 0 < len(wanted) <= MAX_REQUEST_ID and all(33 <= ord(c) <= 126 for c in wanted)
        generated_form = wanted[:1] == "r" and wanted[1:].isdigit()
        if not usable or generated_form or wanted in self._in_flight:
            return next_request_id()
        self._in_flight.add(wanted)
        return wanted

    def release(self, request_id: str) -> None:
        """The request is answered: its id may be used again."""
        self._in_flight.discard(request_id)
