"""Worker log records as one structured line each, for the frontend to re-emit at their level.

A worker's stdout and stderr share one pipe to the frontend, which relays it line by line
(``output_relay.py``). Plain text (``print``, ``warnings``) stays plain; a log record is
written as ``MARKER`` followed by compact JSON on a single line::

    @@ferry-log/1 {"level": "ERROR", "levelno": 40, "logger": "ferry.worker",
                     "message": "handler failed", "exc": "Traceback ...", "request_id": "r7"}

``exc`` is the formatted traceback (or null); ``request_id`` is the id of the request the
worker was running when the record was made, a list of ids for a batch, or null outside
a batch; ``trace``, present when the batch is traced, its span's W3C ``traceparent``. A
line is capped below the relay's line limit: a huge message is shortened first, then the
traceback (its head goes; the tail names the error), then the message.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

MARKER = "@@ferry-log/1 "
"""Starts every forwarded record (``/1``: the format's version). Printable on purpose: a
control byte would split the line for ``str.splitlines`` and hide it on a terminal."""

MAX_LINE_BYTES = 60_000
"""Below asyncio's default 64 KiB stream limit, which the frontend reads worker output with."""

TRUNCATED = "[... truncated ...]"

RequestIds = str | list[str] | None

_request_ids: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "ferry_request_ids", default=()
)


_source: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ferry_log_source", default=None
)

_trace: contextvars.ContextVar[str] = contextvars.ContextVar("ferry_log_trace", default="")

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


@contextmanager
def trace(traceparent: str) -> Iterator[None]:
    """Records made inside the block carry the batch span's ``traceparent`` (none when
    it is "")."""
    token = _trace.set(traceparent)
    try:
        yield
    finally:
        _trace.reset(token)


def trace_ids(traceparent: str | None) -> tuple[str, str] | None:
    """The trace and span ids a W3C ``traceparent`` names; None if it is not one."""
    matched = TRACEPARENT.fullmatch(traceparent or "")
    return (matched.group(1), matched.group(2)) if matched else None


@contextmanager
def source(label: str) -> Iterator[None]:
    """Records made inside the block name ``label`` (the model of a process that hosts
    several: ``ferry.worker.host``)."""
    token = _source.set(label)
    try:
        yield
    finally:
        _source.reset(token)


@contextmanager
def request_ids(ids: Sequence[str]) -> Iterator[None]:
    """Records made inside the block (in this thread or context) carry these request ids."""
    token = _request_ids.set(tuple(ids))
    try:
        yield
    finally:
        _request_ids.reset(token)


def current_request_ids() -> RequestIds:
    """One id, a list for a batch of several, or None outside a batch."""
    ids = _request_ids.get()
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else list(ids)


@dataclass(frozen=True)
class ForwardedRecord:
    """One worker log record as the frontend reads it back."""

    levelno: int
    logger: str
    message: str
    exc: str | None
    request_id: RequestIds
    source: str | None = None
    """Which model of a process hosting several made it (``source``)."""
    trace: str | None = None
    """The traced batch's span it was made in (``traceparent``)."""


class ForwardFormatter(logging.Formatter):
    """Formats a record as ``MARKER`` + one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        exc = self._exception_text(record)
        document: dict[str, Any] = {
            "level": record.levelname,
            "levelno": record.levelno,
            "logger": record.name,
            "message": record.getMessage(),
            "exc": exc,
            "request_id": current_request_ids(),
        }
        if (label := _source.get()) is not None:
            document["source"] = label
        if traceparent := _trace.get():
            document["trace"] = traceparent
        return MARKER + _fit(document)

    def _exception_text(self, record: logging.LogRecord) -> str | None:
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        parts = [text for text in (record.exc_text, record.stack_info) if text]
        return "\n".join(parts) or None


_CUTS = (("message", False, MAX_LINE_BYTES // 4), ("exc", True, 0), ("message", False, 0))
"""In order: a huge message down to a quarter of the line, the traceback's head, the rest
of the message (key, keep the tail or the head, the size not to cut below)."""


def _fit(document: dict[str, Any]) -> str:
    """The JSON line, shortened by ``_CUTS`` until it fits MAX_LINE_BYTES (ASCII-only JSON:
    its length is its size in bytes)."""
    line = json.dumps(document, separators=(",", ":"))
    for key, keep_tail, shortest_bytes in _CUTS:
        text = document[key] or ""
        keep = len(text)
        # Escaping (newlines, quotes) makes a character cost more than a byte: estimate the
        # cut from the average, and cut again if that was not enough.
        bytes_per_char = len(json.dumps(text)) / max(1, len(text))
        shortest = int(shortest_bytes / bytes_per_char)
        while keep > shortest and (excess := len(MARKER) + len(line) - MAX_LINE_BYTES) > 0:
            keep = max(shortest, keep - math.ceil(excess / bytes_per_char) - len(TRUNCATED))
            document[key] = (
                TRUNCATED + text[len(text) - keep :] if keep_tail else text[:keep] + TRUNCATED
            )
            line = json.dumps(document, separators=(",", ":"))
    return line


def parse_forwarded(line: str) -> ForwardedRecord | None:
    """The record a ``MARKER`` line carries; None for plain text or a malformed line."""
    if not line.startswith(MARKER):
        return None
    try:
        document = json.loads(line[len(MARKER) :])
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    levelno, logger, message = (document.get(k) for k in ("levelno", "logger", "message"))
    exc, ids, label = document.get("exc"), document.get("request_id"), document.get("source")
    if not (isinstance(levelno, int) and isinstance(logger, str) and isinstance(message, str)):
        return None
    if exc is not None and not isinstance(exc, str):
        return None
    if not (ids is None or isinstance(ids, str) or _is_str_list(ids)):
        return None
    if label is not None and not isinstance(label, str):
        return None
    traced = document.get("trace")
    traced = traced if isinstance(traced, str) and trace_ids(traced) else None
    return ForwardedRecord(levelno, logger, message, exc, ids, label, traced)


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def install(level: int = logging.INFO) -> None:
    """Route this process's logging, and its uncaught exceptions, through ``ForwardFormatter``
    on stderr. ``print`` and ``warnings`` output is left as plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ForwardFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    logging.getLogger("ferry.worker").critical("uncaught exception", exc_info=(kind, value, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("ferry.worker").error(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )
