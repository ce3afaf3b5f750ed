"""Control characters in logged values are escaped; the server's own text is not."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry import log_escape
from ferry.log_escape import EscapingRecordFactory, Verbatim, escape_control
from ferry.worker_handles.output_relay import relay_line

FORGED = "2026-11-26 11:38:07,003 INFO ferry.access: method=DELETE path=models status=200"


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("plain text, é and 日本 stay", "plain text, é and 日本 stay"),
        (f"nosuch\n{FORGED}", f"nosuch\\n{FORGED}"),
        ("\x1b[31mred\r", "\\x1b[31mred\\r"),
        ("tab\there", "tab\\there"),
        ("nul\x00 bell\x07 del\x7f", "nul\\x00 bell\\x07 del\\x7f"),
        ("c1 \x85 csi \x9b", "c1 \\x85 csi \\x9b"),
        ("separators \u2028 \u2029", "separators \\u2028 \\u2029"),
        ("a backslash \\n stays", "a backslash \\n stays"),
    ],
)
def test_escape_control(text: str, escaped: str) -> None:
    assert escape_control(text) == escaped
    assert escape_control(text).isprintable() or "日本" in text


@pytest.fixture
def escaping() -> Iterator[io.StringIO]:
    """A logger writing plain lines to a string, with the escaping factory installed."""
    previous = logging.getLogRecordFactory()
    log_escape.install()
    log_escape.install()  # idempotent: one wrapper, not two
    factory = logging.getLogRecordFactory()
    assert isinstance(factory, EscapingRecordFactory) and factory.wrapped is previous
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("ferry.test_escape")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logging.setLogRecordFactory(previous)


def test_record_arguments_are_escaped_and_the_server_text_is_not(escaping: io.StringIO) -> None:
    log = logging.getLogger("ferry.test_escape")
    log.info("model %s not found", f"nosuch\n{FORGED}")
    log.info("%(name)s by name", {"name": "a\rb"})
    log.info("error: %s, %d requests, %.1f ms, %r", ValueError("x\x1by"), 3, 2.5, Path("/p"))
    log.info("server's own\nmulti-line text: %s", Verbatim("pip said\nthis"))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("unhandled error on %s", "/predictions/x\ny")
    lines = escaping.getvalue().splitlines()
    assert lines[0] == f"INFO ferry.test_escape: model nosuch\\n{FORGED} not found"
    assert not any(line.startswith(FORGED) for line in lines)
    assert lines[1].endswith(": a\\rb by name")
    assert lines[2].endswith(": error: x\\x1by, 3 requests, 2.5 ms, PosixPath('/p')")
    assert lines[3:6] == [
        "INFO ferry.test_escape: server's own",
        "multi-line text: pip said",
        "this",
    ]
    assert lines[6] == "ERROR ferry.test_escape: unhandled error on /predictions/x\\ny"
    assert lines[7] == "Traceback (most recent call last):"  # the traceback prints as it is
    assert lines[-1] == "RuntimeError: boom"


def test_a_handlers_relayed_lines_are_kept_and_ferrys_are_escaped(
    escaping: io.StringIO,
) -> None:
    output = logging.getLogger("ferry.test_escape")
    prefix = "[echo w0.0 pid 7]"
    relay_line(output, prefix, "\x1b[32mprogress\x1b[0m")  # print(): the handler's
    handler_record = '{"levelno":20,"logger":"my_handler","message":"table:\\nrow 1"}'
    relay_line(output, prefix, "@@ferry-log/1 " + handler_record)
    ferry_record = '{"levelno":30,"logger":"ferry.worker","message":"batch failed (bad\\nx)"}'
    relay_line(output, prefix, "@@ferry-log/1 " + ferry_record)
    assert escaping.getvalue().splitlines() == [
        f"INFO ferry.test_escape: {prefix} \x1b[32mprogress\x1b[0m",
        f"INFO ferry.test_escape: {prefix} my_handler: table:",
        "row 1",
        f"WARNING ferry.test_escape: {prefix} ferry.worker: batch failed (bad\\nx)",
    ]
