"""Worker log records: one structured line each on the worker side, one record each after the
frontend's relay, at their own level, with the traceback and the request ids."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ferry.handlers.contract.context import Context
from ferry.logs import PLAIN_FORMAT, JsonFormatter
from ferry.wire.log_forward import (
    MARKER,
    MAX_LINE_BYTES,
    ForwardFormatter,
    current_request_ids,
    parse_forwarded,
    request_ids,
)
from ferry.wire.messages import PredictBatch, RequestItem
from ferry.worker.runner import BatchRunner
from ferry.worker_handles.output_relay import OUTPUT_LOGGER, relay_output

PREFIX = "[digest w0.0 pid 42]"


def _record(level: int, message: str, *, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("asked to fail")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("handler.mod", level, __file__, 1, message, None, exc_info)


def _forwarded(line: str) -> dict[str, Any]:
    assert line.startswith(MARKER) and "\n" not in line
    document: dict[str, Any] = json.loads(line[len(MARKER) :])
    return document


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def collected() -> Iterator[list[logging.LogRecord]]:
    handler = Collect()
    logger = logging.getLogger(OUTPUT_LOGGER)
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.DEBUG
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _relay(lines: list[str]) -> None:
    async def run() -> None:
        stream = asyncio.StreamReader()
        stream.feed_data("".join(line + "\n" for line in lines).encode())
        stream.feed_eof()
        await relay_output(stream, PREFIX)

    asyncio.run(run())


# -- worker side --------------------------------------------------------------------------


def test_a_record_with_a_traceback_is_one_line_with_the_traceback_as_a_field() -> None:
    line = ForwardFormatter().format(_record(logging.ERROR, "handler failed", exc=True))
    document = _forwarded(line)
    assert document["level"] == "ERROR" and document["levelno"] == logging.ERROR
    assert document["logger"] == "handler.mod" and document["message"] == "handler failed"
    assert document["exc"].startswith("Traceback (most recent call last):")
    assert document["exc"].rstrip().endswith("ValueError: asked to fail")
    assert document["request_id"] is None


def test_the_request_ids_come_from_the_batch_being_run() -> None:
    formatter = ForwardFormatter()
    with request_ids(["r7"]):
        one = _forwarded(formatter.format(_record(logging.WARNING, "odd input")))
        with request_ids(["r8", "r9"]):
            batch = _forwarded(formatter.format(_record(logging.INFO, "batch")))
        assert current_request_ids() == "r7"
    assert one["request_id"] == "r7" and one["exc"] is None
    assert batch["request_id"] == ["r8", "r9"]
    assert current_request_ids() is None


@pytest.mark.parametrize(("message_size", "frames"), [(50_000, 20_000), (100, 20_000), (99_000, 1)])
def test_an_oversized_record_is_cut_to_fit_the_relay_limit(message_size: int, frames: int) -> None:
    record = _record(logging.ERROR, "m" * message_size)
    record.exc_text = '  File "h.py", line 1\n' * frames + "ValueError: the end"
    line = ForwardFormatter().format(record)
    assert len(line.encode()) <= MAX_LINE_BYTES
    document = _forwarded(line)
    assert document["exc"].endswith("ValueError: the end")  # the tail names the error
    assert document["message"].startswith("mmm")
    assert len(document["message"]) >= min(message_size, MAX_LINE_BYTES // 4)


def test_the_runner_names_the_requests_of_the_batch_in_its_records() -> None:
    seen: list[object] = []

    def entry(rows: list[Any], context: Context) -> list[Any]:
        seen.append(current_request_ids())
        raise ValueError("asked to fail")

    runner = BatchRunner(entry, Context("m", ".", {}, 2, None))
    items = [RequestItem(f"r{i}", {}, []) for i in (1, 2)]
    stderr = io.StringIO()  # the worker formats each record as it is made, like install()
    handler = logging.StreamHandler(stderr)
    handler.setFormatter(ForwardFormatter())
    logger = logging.getLogger("ferry.worker")
    logger.addHandler(handler)
    try:
        runner.run(PredictBatch(1, items))
    finally:
        logger.removeHandler(handler)
    lines = [_forwarded(line) for line in stderr.getvalue().split("\n")[:-1]]
    assert seen == [["r1", "r2"], "r1", "r2"]
    assert [(d["level"], d["request_id"]) for d in lines] == [
        ("WARNING", ["r1", "r2"]),
        ("ERROR", "r1"),
        ("ERROR", "r2"),
    ]


# -- frontend side ------------------------------------------------------------------------


def test_a_forwarded_error_becomes_one_record_at_its_level(
    collected: list[logging.LogRecord],
) -> None:
    with request_ids(["r7"]):
        line = ForwardFormatter().format(_record(logging.ERROR, "handler failed", exc=True))
    _relay([line])
    [record] = collected
    assert record.name == OUTPUT_LOGGER and record.levelno == logging.ERROR
    assert record.getMessage() == f"{PREFIX} handler.mod: handler failed"
    assert record.exc_text is not None and "ValueError: asked to fail" in record.exc_text
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["request_id"] == "r7" and fields["worker_logger"] == "handler.mod"


def test_the_formatters_print_the_traceback_once_with_the_record(
    collected: list[logging.LogRecord],
) -> None:
    with request_ids(["r1", "r2"]):
        line = ForwardFormatter().format(_record(logging.ERROR, "handler failed", exc=True))
    _relay([line])
    [record] = collected
    document = json.loads(JsonFormatter().format(record))
    assert document["level"] == "ERROR" and document["request_id"] == ["r1", "r2"]
    assert document["exception"].rstrip().endswith("ValueError: asked to fail")
    plain = logging.Formatter(PLAIN_FORMAT).format(record).splitlines()
    assert plain[0].endswith(f"ERROR {OUTPUT_LOGGER}: {PREFIX} handler.mod: handler failed")
    assert plain[1] == "Traceback (most recent call last):"


def test_plain_and_malformed_lines_stay_plain_text_at_info(
    collected: list[logging.LogRecord],
) -> None:
    broken = MARKER + '{"levelno": 40, "logger": "x", "message":'
    wrong = MARKER + json.dumps({"levelno": "high", "logger": "x", "message": "m"})
    _relay(["digest handler ready", broken, wrong, MARKER + "[" * 60_000])
    assert [r.levelno for r in collected] == [logging.INFO] * 4
    assert collected[0].getMessage() == f"{PREFIX} digest handler ready"
    assert collected[1].getMessage() == f"{PREFIX} {broken}"
    assert all(r.exc_text is None for r in collected)


def test_a_line_over_the_stream_limit_does_not_stop_the_relay(
    collected: list[logging.LogRecord],
) -> None:
    _relay(["x" * 200_000, "after"])
    assert collected[-1].getMessage() == f"{PREFIX} after"


def test_parse_rejects_what_is_not_a_forwarded_record() -> None:
    assert parse_forwarded("plain") is None
    assert parse_forwarded(MARKER + "[]") is None
    assert parse_forwarded(MARKER + json.dumps({"levelno": 20, "logger": "x"})) is None
    record = {"levelno": 20, "logger": "x", "message": "m", "request_id": [1]}
    assert parse_forwarded(MARKER + json.dumps(record)) is None


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_traced_batchs_records_carry_its_span_to_the_frontends_fields(
    collected: list[logging.LogRecord],
) -> None:
    """The worker names the batch span the frontend sent; the relay gives its trace and
    span ids as fields (``--log-format json`` prints them)."""

    def entry(rows: list[Any], context: Context) -> list[Any]:
        logging.getLogger("handler.mod").warning("looking at %d rows", len(rows))
        return ["ok"] * len(rows)

    runner = BatchRunner(entry, Context("m", ".", {}, 2, None))
    stderr = io.StringIO()
    handler = logging.StreamHandler(stderr)
    handler.setFormatter(ForwardFormatter())
    logger = logging.getLogger("handler.mod")
    logger.addHandler(handler)
    try:
        runner.run(PredictBatch(1, [RequestItem("r1", {}, [])], TRACEPARENT))
        runner.run(PredictBatch(2, [RequestItem("r2", {}, [])]))  # untraced
    finally:
        logger.removeHandler(handler)
    lines = stderr.getvalue().split("\n")[:-1]
    assert [_forwarded(line).get("trace") for line in lines] == [TRACEPARENT, None]
    _relay(lines)
    traced, untraced = (record.fields for record in collected)  # type: ignore[attr-defined]
    assert (traced["trace_id"], traced["span_id"]) == (
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "00f067aa0ba902b7",
    )
    assert "trace_id" not in untraced


def test_a_malformed_trace_is_not_relayed() -> None:
    line = ForwardFormatter().format(_record(logging.INFO, "x"))
    document = _forwarded(line)
    document["trace"] = "00-not-a-trace\nforged=1"
    forged = parse_forwarded(MARKER + json.dumps(document))
    assert forged is not None and forged.trace is None
