"""Log lines a client cannot forge: control characters in logged values are escaped.

A value a client controls (a request path, a model name or version from a URL, a header,
a remote archive URL) can hold a newline, a carriage return or a terminal escape. Logged
as it is, ``POST /predictions/x%0A2026-11-26 ... INFO ferry.access: ...`` writes a second,
forged line, and ``%1b[31m`` repaints the operator's terminal. So every record's
*arguments* are escaped (``escape_control``) as the record is made, by the record factory
``install`` puts in place, whatever handler or formatter then writes it (Ferry's, uvicorn's
own, a ``--log-config`` of the user's). The format string is the server's own text and
stays as written; so are the traceback (``exc_info``) and stack, which are the server's,
not the client's, and print on their lines below the message.

Rule for Ferry's code: put a value in the record's arguments (``log.info("model %s",
name)``), never in the format string (no f-strings), and wrap in ``Verbatim`` only text
that the server or a model's own code wrote and that may span lines on purpose (a
handler's log message, pip's output).

Access lines written without logging (``ferry.logs.AccessLines``) are escaped where they
are built, with the same function. ``--log-format json`` escapes as JSON does anyway.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 controls, DEL, C1 controls (NEL ``\\x85`` ends a line for some readers) and the
Unicode line and paragraph separators, which ``str.splitlines`` splits on."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_control(text: str) -> str:
    """``text`` on one line with no control characters: ``\\n``, ``\\r`` and ``\\t`` as
    those two characters, the others as ``\\xNN`` (``\\u2028``, ``\\u2029``).

    >>> escape_control("nosuch\\n2026 INFO ferry.access: forged\\x1b[31m")
    'nosuch\\\\n2026 INFO ferry.access: forged\\\\x1b[31m'

    Backslashes are left alone: the point is that a line cannot be split or a terminal
    driven, not that the value can be decoded back."""
    if text.isprintable():  # the usual case, in C: nothing to escape
        return text
    return _CONTROL.sub(_escaped, text)


class Verbatim(str):
    """A log argument printed as it is, lines and all: text the server or a model's own
    code wrote (a handler's log message, pip's output). Never a client's value."""

    __slots__ = ()


def _escaped_arg(value: object) -> object:
    if isinstance(value, Verbatim | int | float) or value is None:
        return value
    if isinstance(value, str):
        return escape_control(value)
    try:
        text = str(value)  # an exception, a path, a list: as %s would print it
    except Exception:  # logging reports a value it cannot print; not this factory's job
        return value
    # Kept as the object when it prints safely, so %r and format specs still apply to it.
    return value if text.isprintable() else escape_control(text)


def escape_record(record: logging.LogRecord) -> None:
    """Escape ``record``'s arguments in place (a message that is not a str, logged
    without arguments, is a value too)."""
    args = record.args
    if isinstance(args, tuple):
        if args:
            record.args = tuple(_escaped_arg(value) for value in args)
    elif isinstance(args, Mapping):  # log.info("%(name)s", {"name": ...})
        record.args = {key: _escaped_arg(value) for key, value in args.items()}
    if not isinstance(record.msg, str) and not args:
        record.msg = _escaped_arg(record.msg)


class EscapingRecordFactory:
    """The record factory that escapes each record's arguments as it is made, around the
    factory that was in place (``logging.setLogRecordFactory``)."""

    def __init__(self, wrapped: Callable[..., logging.LogRecord]) -> None:
        self.wrapped = wrapped

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.wrapped(*args, **kwargs)
        escape_record(record)
        return record


def install() -> None:
    """Escape every record made from now on in this process (once; idempotent).

    A process-wide hook, on purpose: a record reaches handlers that Ferry does not own
    (uvicorn configures its own, ``--log-config`` replaces Ferry's), and the factory is the
    one place every record passes. Only the server's process calls it: a worker's records
    are the handler's, relayed as written (``ferry.worker_handles.output_relay``)."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, EscapingRecordFactory):
        logging.setLogRecordFactory(EscapingRecordFactory(factory))


__all__ = ["EscapingRecordFactory", "Verbatim", "escape_control", "escape_record", "install"]
