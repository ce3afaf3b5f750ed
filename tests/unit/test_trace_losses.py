"""Lost spans in the log: the first of each reason at once, then at most one line per
reason and interval with what was lost since (issue 47, item 8: OTLP export failures
were counted, never logged). The clock is injected."""

from __future__ import annotations

import logging

import pytest

from ferry.tracing.losses import LossLog, RepeatFilter

LOGGER = "ferry.tracing.test"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [record.getMessage() for record in caplog.records if record.name == LOGGER]
    caplog.clear()
    return lines


def test_the_first_loss_is_logged_at_once_and_the_next_ones_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    clock = Clock()
    losses = LossLog(logging.getLogger(LOGGER), interval=30.0, clock=clock)
    losses.lost("the export queue was full", 512)
    assert _lines(caplog) == [
        "trace export: 512 spans lost: the export queue was full "
        "(such losses are logged at most every 30 s)"
    ]
    for _ in range(20):  # a batch a second: counted, not logged
        clock.now += 1
        losses.lost("the export queue was full", 512)
    assert _lines(caplog) == []
    clock.now += 10  # 30 s after the first line
    losses.lost("the export queue was full", 100)
    assert _lines(caplog) == [
        "trace export: 10340 spans lost in 21 batches in the last 30 s: the export queue was full"
    ]


def test_each_reason_has_its_own_interval_and_shows_the_latest_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    clock = Clock()
    losses = LossLog(logging.getLogger(LOGGER), interval=30.0, clock=clock)
    losses.lost("ConnectionError", 4, "collector unreachable")
    losses.lost("the export queue was full", 2)  # another reason: logged at once too
    assert len(_lines(caplog)) == 2
    clock.now += 5
    losses.lost("ConnectionError", 4, "connection reset")
    clock.now += 25
    losses.lost("ConnectionError", 4, "connection refused")
    assert _lines(caplog) == [
        "trace export: 8 spans lost in 2 batches in the last 30 s: "
        "ConnectionError: connection refused"
    ]


def test_losses_held_back_are_logged_once_their_interval_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    clock = Clock()
    losses = LossLog(logging.getLogger(LOGGER), interval=30.0, clock=clock)
    losses.lost("r", 1)
    clock.now += 1
    losses.lost("r", 7)  # held back, and no loss comes after it
    _lines(caplog)
    clock.now += 10
    losses.report_due()
    assert _lines(caplog) == []  # not due yet
    clock.now += 19
    losses.report_due()
    assert _lines(caplog) == ["trace export: 7 spans lost in 1 batches in the last 30 s: r"]
    clock.now += 300
    losses.report_due()  # nothing lost since
    assert _lines(caplog) == []


def _record(name: str, message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, args, None)


def test_the_exporters_own_lines_pass_once_per_interval_saying_how_many_were_held() -> None:
    clock = Clock()
    repeats = RepeatFilter("opentelemetry", interval=30.0, clock=clock)
    sdk = "opentelemetry.exporter.otlp.proto.grpc.exporter"
    failed = "Failed to export traces to %s, error code: %s"
    assert repeats.filter(_record(sdk, failed, "collector:4317", "UNAVAILABLE"))
    for _ in range(29):
        clock.now += 1
        assert not repeats.filter(_record(sdk, failed, "collector:4317", "UNAVAILABLE"))
    assert repeats.filter(_record(sdk, "Shutdown in progress, aborting retry."))  # another
    assert repeats.filter(_record("ferry.tracing", failed, "c", "x"))  # not the SDK's
    clock.now += 1
    passed = _record(sdk, failed, "collector:4317", "DEADLINE_EXCEEDED")
    assert repeats.filter(passed)
    assert passed.getMessage() == (
        "Failed to export traces to collector:4317, error code: DEADLINE_EXCEEDED "
        "(29 more such lines in the last 30 s)"
    )
