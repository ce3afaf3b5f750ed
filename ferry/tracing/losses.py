"""Spans lost on their way to the collector, said in the log, at a bounded rate.

Each loss is counted in ``ferry_trace_spans_dropped_total``; before issue 47 that was all,
and a collector that was down, refused every batch or could not keep up left nothing in
the log. One line per failed batch would be a line a second for as long as it lasts, so
``LossLog`` writes the first loss of each reason at once, then at most one line per reason
every ``interval`` seconds with what was lost since the line before:

    >>> losses = LossLog(logging.getLogger("ferry.tracing"), interval=30.0)
    >>> losses.lost("the export queue was full", 512)  # logged now
    >>> losses.lost("the export queue was full", 512)  # counted for the next line
    >>> losses.report_due()  # from a periodic task: what waited its interval out

OpenTelemetry's exporter logs each batch it fails too (a line or two per batch, with the
collector's error): in the exporter process ``RepeatFilter`` lets each of its messages
through at most once per interval, saying how many it held back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

INTERVAL = 30.0
"""Seconds between two lines of the same reason."""


@dataclass
class _Tally:
    """What one reason lost since its last line."""

    spans: int = 0
    batches: int = 0
    detail: str = ""
    """The latest loss's own words (an exception's message), if it had any."""
    last_line: float | None = None
    """When its last line was written (None: never)."""


class LossLog:
    """Lost spans, logged as a warning: the first of each reason at once, then at most one
    line per reason every ``interval`` seconds (``clock``: monotonic seconds, injected by
    tests), with the spans and batches lost since the line before. Called from the serving
    thread (a full queue) and the export thread alike."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._interval, self._clock = logger, interval, clock
        self._tallies: dict[str, _Tally] = {}
        self._lock = threading.Lock()

    def lost(self, reason: str, spans: int, detail: str = "") -> None:
        """``spans`` were lost, for ``reason`` (the key lines are limited by, so it must
        not vary from one loss to the next); ``detail`` (an exception's message) is shown
        as the latest seen."""
        with self._lock:
            tally = self._tallies.setdefault(reason, _Tally())
            tally.spans += spans
            tally.batches += 1
            tally.detail = detail or tally.detail
            self._report_if_due(reason, tally, self._clock())

    def report_due(self) -> None:
        """Write the lines whose interval has passed since the line before (losses that
        came while a line was held back, and none since)."""
        with self._lock:
            now = self._clock()
            for reason, tally in self._tallies.items():
                self._report_if_due(reason, tally, now)

    def _report_if_due(self, reason: str, tally: _Tally, now: float) -> None:
        if not tally.batches:
            return
        if tally.last_line is not None and now - tally.last_line < self._interval:
            return
        said = f"{reason}: {tally.detail}" if tally.detail else reason
        if tally.last_line is None:
            self._log.warning(
                "trace export: %d spans lost: %s (such losses are logged at most every %g s)",
                tally.spans,
                said,
                self._interval,
            )
        else:
            self._log.warning(
                "trace export: %d spans lost in %d batches in the last %.0f s: %s",
                tally.spans,
                tally.batches,
                now - tally.last_line,
                said,
            )
        tally.spans = tally.batches = 0
        tally.detail = ""
        tally.last_line = now


class RepeatFilter(logging.Filter):
    """A handler's filter: a record of a logger under ``prefix`` passes at most once every
    ``interval`` seconds per logger and message format (its text before the arguments);
    the next to pass says how many were held back since the one before."""

    def __init__(
        self,
        prefix: str,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._prefix, self._interval, self._clock = prefix, interval, clock
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self._prefix) or not isinstance(record.msg, str):
            return True
        key, now = (record.name, record.msg), self._clock()
        with self._lock:
            passed, held = self._seen.get(key, (None, 0))
            if passed is not None and now - passed < self._interval:
                self._seen[key] = (passed, held + 1)
                return False
            self._seen[key] = (now, 0)
        if held and passed is not None:
            # Appended to the format: no % in it, and the record's arguments still apply.
            record.msg += f" ({held} more such lines in the last {now - passed:.0f} s)"
        return True


__all__ = ["INTERVAL", "LossLog", "RepeatFilter"]
