"""The exporter process: the server hands it batches of span records; it encodes and
sends them with OpenTelemetry's exporter, configured by the ``OTEL_*`` variables.

Why a process: the server's event loop is what limits a light model's throughput, and an
export thread in the same process takes its share of the GIL; handing the records over
(``marshal``, under a microsecond a span) leaves the encoding and the collector's
connection to a process of their own, which runs only on CPU time nothing else wants
(``run_on_idle_cpu``). With cores to spare the server's loop does none of the exporting;
on two shared cores the exporter fills the gaps the closed loop of serving leaves
(benchmarks/results/tracing_overhead.md).

Frames on its stdin: a 4-byte big-endian length, then a ``marshal``-ed list of records
(``ferry.tracing.records.Record``: plain tuples; their spans are made here). On the
answer pipe (its one argument, a file descriptor): ``ready`` (or ``failed REASON``) once
its exporter is built, then ``lost N`` whenever a batch fails: the spans it has failed to
export so far. Its stdout and stderr are the server's. End of input (the server closed
the pipe, or died) makes it send what it has and exit.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import IO

from ferry.errors import ConfigError
from ferry.tracing.losses import LossLog, RepeatFilter
from ferry.tracing.otel import (
    InProcessExport,
    configured_sampler,
    exporter_from_environment,
    exports,
    resource_from,
)
from ferry.tracing.recorder import BoundedExport, Recorder
from ferry.tracing.records import Record, span_count

log = logging.getLogger("ferry.tracing")

_LENGTH = struct.Struct(">I")
_STARTUP_TIMEOUT = 60.0
EXPORTER_NICENESS = 19
"""Where Linux's idle scheduling class is not to be had: the lowest priority."""


class ExporterProcess:
    """The server's end: a ``SpanDestination`` that writes batches to the process, and
    starts a new one (at most every ``RESTART_INTERVAL`` seconds) when it has ended.

    Its writes never block (``never_blocks``): what the pipe cannot take yet waits here,
    up to ``MAX_UNWRITTEN`` bytes (beyond, a batch is lost and counted), for the next
    ``send`` or ``send_pending``. So the server's event loop can send a full batch itself
    even while the exporter, which runs only on idle CPU, is behind."""

    RESTART_INTERVAL = 5.0
    MAX_UNWRITTEN = 4 << 20
    never_blocks = True
    loss_reason = "the exporter process had ended, or was over 4 MiB behind"

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = dict(environ)
        self._lost_before = 0
        self._started_at = 0.0
        self._start()

    def _start(self) -> None:
        self._started_at = time.monotonic()
        # Its answers on a pipe of their own: its stdout is the server's (the console
        # exporter prints there).
        answers, answer_end = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-P", "-m", "ferry.tracing.export_process", str(answer_end)],
                stdin=subprocess.PIPE,
                pass_fds=(answer_end,),
                env=self._environ,
            )
        finally:
            os.close(answer_end)
        assert self._process.stdin is not None
        self._input: IO[bytes] = self._process.stdin
        self._pipe = self._input.fileno()
        os.set_blocking(self._pipe, False)
        self._unwritten: deque[memoryview] = deque()  # frames, the first maybe in part
        self._unwritten_bytes = 0
        self._answers = os.fdopen(answers, "rb")
        self._ready = threading.Event()
        self._started = False
        self._failure = ""
        self._lost = 0
        self._lost_unwritten = 0
        self._unwritten_spans = 0  # in what is unwritten: lost if the process ends
        self._reader = threading.Thread(
            target=self._read_answers, name="ferry-span-export-answers", daemon=True
        )
        self._reader.start()
        if not self._ready.wait(_STARTUP_TIMEOUT) or not self._started:
            self.close()
            raise ConfigError(
                self._failure
                or "the trace exporter process ended before it was ready (its error is above)"
            )

    def _read_answers(self) -> None:
        for raw in self._answers:
            kind, _, value = raw.decode(errors="replace").strip().partition(" ")
            if kind == "ready":
                self._started = True
                self._ready.set()
            elif kind == "failed":  # its configuration was refused: the server's error
                self._failure = value
                self._ready.set()
            elif kind == "lost":
                self._lost = int(value)
        self._ready.set()  # it ended

    @property
    def lost(self) -> int:
        return self._lost_before + self._lost + self._lost_unwritten

    def send(self, records: list[Record]) -> bool:
        if self._process.poll() is not None:
            return False  # lost: ``send_pending``, from the export thread, starts another
        body = marshal.dumps(records)
        frame = _LENGTH.pack(len(body)) + body
        if self._unwritten_bytes + len(frame) > self.MAX_UNWRITTEN:
            self._write_pending()
            if self._unwritten_bytes + len(frame) > self.MAX_UNWRITTEN:
                return False  # the exporter is this far behind: the batch is lost
        self._unwritten.append(memoryview(frame))
        self._unwritten_bytes += len(frame)
        self._unwritten_spans += sum(map(span_count, records))
        self._write_pending()
        return True

    def send_pending(self) -> None:
        """Write what the pipe can take; a process that has ended is replaced here (at
        most every ``RESTART_INTERVAL`` seconds), on the export thread: starting one takes
        seconds, which the event loop's sends must never wait for."""
        if self._process.poll() is not None:
            self._restart()
        else:
            self._write_pending()

    def _write_pending(self) -> None:
        unwritten = self._unwritten
        while unwritten:
            try:  # one system call for all the frames waiting (none copied again)
                written = os.writev(self._pipe, list(unwritten))
            except BlockingIOError:  # the pipe is full: the exporter is behind
                return
            except OSError:  # it has ended: what it never read is lost
                self._lost_unwritten += self._unwritten_spans
                unwritten.clear()
                self._unwritten_bytes = 0
                break
            self._unwritten_bytes -= written
            while written:
                first = unwritten[0]
                if len(first) > written:
                    unwritten[0] = first[written:]
                    break
                written -= len(first)
                unwritten.popleft()
        self._unwritten_spans = 0

    def _restart(self) -> None:
        if time.monotonic() - self._started_at < self.RESTART_INTERVAL:
            return
        log.warning(
            "the trace exporter process ended (exit status %s); starting another",
            self._process.returncode,
        )
        self.close()  # what is left of it: its pipes (its last answers read)
        self._lost_before += self._lost + self._lost_unwritten
        self._start()

    def close(self) -> None:
        """Write what is left, close its input (it sends what it has and exits) and wait
        for it."""
        with contextlib.suppress(OSError):  # it is gone already
            os.set_blocking(self._pipe, True)
            self._write_pending()
        with contextlib.suppress(OSError):
            self._input.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)
        self._answers.close()


def process_tracing(environ: Mapping[str, str] | None = None) -> Recorder:
    """Ferry's tracing as the server runs it: the exporter the ``OTEL_*`` variables name,
    in a process of its own, which builds it (a wrong variable is refused at start-up
    all the same: the process answers ``failed``, a ``ConfigError`` here)."""
    env = os.environ if environ is None else environ
    sampler = configured_sampler(env)
    return Recorder(sampler, BoundedExport(ExporterProcess(env)) if exports(env) else None)


def _next_batch(source: IO[bytes]) -> list[Record] | None:
    """The next batch (None at the end of input)."""
    header = source.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(header)
    body = source.read(length)
    if len(body) < length:
        return None
    records: list[Record] = marshal.loads(body)
    return records


def run_on_idle_cpu() -> None:
    """Serving before exporting: this process runs only when a core would otherwise idle
    (Linux's ``SCHED_IDLE``). A lower niceness is not enough: measured on two shared
    cores, the no-op model traced at 0.77x of untraced with the exporter at niceness 10,
    0.79x at 19 and 0.85x in the idle class (six interleaved rounds, ahead in each), since
    a server woken by a request waits for a niced exporter's time slice but preempts an
    idle-class one at once. On a machine with no idle CPU the exporter falls behind, its
    pipe fills and the server drops spans (counted) instead of answering later."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or refused: the lowest niceness then
        os.nice(EXPORTER_NICENESS)


def main() -> None:
    run_on_idle_cpu()
    # Ctrl-C reaches the server's whole process group: the server decides when this ends
    # (it closes the input, and this process sends what it holds first).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # the SDK's exporter: a line per failed batch
        handler.addFilter(RepeatFilter("opentelemetry"))
    answers = os.fdopen(int(sys.argv[1]), "w")

    try:
        exporter = exporter_from_environment()
    except ConfigError as error:
        print(f"failed {error}", file=answers, flush=True)
        sys.exit(2)
    if exporter is None:  # the server starts no process without an exporter
        print("failed OTEL_TRACES_EXPORTER=none", file=answers, flush=True)
        sys.exit(2)
    destination = InProcessExport(exporter, resource_from(os.environ))
    print("ready", file=answers, flush=True)
    _export_batches(destination, answers)
    destination.close()


def _export_batches(destination: InProcessExport, answers: IO[str]) -> None:
    """Send each batch of the input; answer ``lost N`` after each that failed, and log
    the losses at a bounded rate (the process's stderr is the server's)."""
    lost = 0
    losses = LossLog(log)
    while (batch := _next_batch(sys.stdin.buffer)) is not None:
        spans = sum(map(span_count, batch))
        try:
            sent = destination.send(batch)
        except Exception as error:  # an exporter's own failure must not end the process
            losses.lost(type(error).__name__, spans, str(error))
            sent = False
        else:
            if not sent:
                losses.lost(destination.loss_reason, spans)
        if not sent:
            lost += spans
            print(f"lost {lost}", file=answers, flush=True)
        losses.report_due()


if __name__ == "__main__":
    main()
