"""A worker's stdout and stderr, line by line, into the frontend's log.

Everything lands on the logger ``ferry.worker.output``, each message starting with the
worker's prefix (``[model worker pid N]``):

- a log record the worker forwarded (``log_forward.MARKER`` lines) becomes one record at
  the worker's level, its message ``PREFIX LOGGER: MESSAGE``, its traceback as the
  record's exception text, and the fields ``worker_logger``, ``request_id`` (one id, or a
  list for a batch), ``trace_id`` and ``span_id`` (a traced batch's span) and ``exception``
  for ``--log-format json``;
- anything else (``print``, ``warnings``, a malformed marker line) stays plain text at INFO.

A handler's text is relayed as written (``ferry.log_escape.Verbatim``): its multi-line
messages and tracebacks print normally. Messages of Ferry's own worker loggers are escaped
like every record of the frontend's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ferry.log_escape import Verbatim
from ferry.wire.log_forward import ForwardedRecord, parse_forwarded, trace_ids

OUTPUT_LOGGER = "ferry.worker.output"


async def relay_output(stream: asyncio.StreamReader, prefix: str) -> None:
    """Relay ``stream`` until it ends; ``prefix`` names the worker in every message."""
    output = logging.getLogger(OUTPUT_LOGGER)
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # a line longer than the stream limit: take what is there
            line = await stream.read(1 << 16)
        if not line:
            return
        relay_line(output, prefix, line.decode(errors="replace").rstrip())


def relay_line(output: logging.Logger, prefix: str, text: str) -> None:
    forwarded = parse_forwarded(text)
    if forwarded is None:
        output.info("%s %s", prefix, Verbatim(text))  # the handler's own output, as written
    elif output.isEnabledFor(forwarded.levelno):
        if forwarded.source is not None:  # a model of a process that hosts several
            prefix = f"{prefix} [{forwarded.source}]"
        output.handle(_record(output, prefix, forwarded))


def _record(output: logging.Logger, prefix: str, forwarded: ForwardedRecord) -> logging.LogRecord:
    fields: dict[str, Any] = {"worker_logger": forwarded.logger}
    if forwarded.request_id is not None:
        fields["request_id"] = forwarded.request_id
    ids = trace_ids(forwarded.trace)
    if ids is not None:
        fields["trace_id"], fields["span_id"] = ids
    if forwarded.exc is not None:
        # JsonFormatter reads exc_info, which a relayed record cannot have: name it here.
        fields["exception"] = forwarded.exc
    record = output.makeRecord(
        output.name,
        forwarded.levelno,
        "(worker)",
        0,
        "%s %s: %s",
        (prefix, forwarded.logger, _as_written(forwarded)),
        None,
        extra={"fields": fields},
    )
    record.exc_text = forwarded.exc  # plain formatters print it below the message
    return record


def _as_written(forwarded: ForwardedRecord) -> str:
    """A handler's message kept as it wrote it (lines and all: it is the handler's, not a
    client's); one of Ferry's own worker loggers is escaped like the frontend's records,
    since its values (a handler's error text) may repeat a client's input."""
    logger = forwarded.logger
    if logger == "ferry" or logger.startswith("ferry."):
        return forwarded.message
    return Verbatim(forwarded.message)
