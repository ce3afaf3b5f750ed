"""Traces of where a request's time went, as OpenTelemetry spans (off by default).

With ``enable_tracing=true`` every request gets a span from the moment the service takes
it to its answer, the child of the client's W3C ``traceparent`` (any API: HTTP headers
and gRPC metadata reach the service as the request's headers), with a child span for its
wait in the queue. Each batch gets a span, with a child per handler stage timed in the
worker (preprocess, inference, postprocess; ``handle`` for a handler without stages),
their times as the worker measured them. A batch and the requests it served point at
each other: the batch span links every request span, each request span links the batch
span (it lives in the trace of the first sampled request it served). Only one process
exports, the server's exporter process: workers report their stage times with the
batch's answer, so no worker opens a connection of its own.

Off, nothing here imports OpenTelemetry and ``Tracing.request`` returns None: a request
carries no trace, and the scheduler's only cost is checking that.

Tracing is the request path's observer (``ferry.scheduling.observers``): the scheduler
tells it of each request and batch and it keeps their spans; nothing else on the request
path knows of it. A workflow's span around its nodes (``Tracing.span``) and the export
at the server's exit are called apart, by the workflow manager and the server.
``ferry.tracing.otel`` builds the tracer from the settings and the ``OTEL_*``
environment variables; the rest of Ferry sees only ``Tracing``.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Mapping, Sequence

from ferry.errors import ConfigError
from ferry.scheduling.jobs import RequestWatch
from ferry.scheduling.observers import BatchWatch

INSTALL_HINT = "pip install 'ferry-serve[otel]'"


class Tracing:
    """Tracing off: no request gets a trace. On (``Recorder``), it is the request path's
    ``Observer``."""

    enabled = False

    def request(
        self, model: str, version: str, request_id: str, headers: Mapping[str, str]
    ) -> RequestWatch | None:
        """A trace for a request the scheduler takes (None when off, or not sampled in)."""
        return None

    def batch(
        self,
        model: str,
        batch_id: int,
        size: int,
        requests: Sequence[RequestWatch],
        worker: Mapping[str, str | int],
    ) -> BatchWatch | None:
        """A span for a batch of traced requests, linked to theirs, whose queue spans end
        (None when off)."""
        return None

    @contextlib.contextmanager
    def span(self, name: str, headers: dict[str, str]) -> Iterator[dict[str, str]]:
        """A span around a request made of requests (a workflow's run), the child of the
        client's ``traceparent``: yields the headers to send its parts, naming it as their
        parent (``headers`` themselves when off)."""
        yield headers

    def shutdown(self) -> None:
        """Export what is left (at the server's exit)."""

    @property
    def dropped_spans(self) -> int:
        """Spans the exporter lost (its queue full, or its export failed)."""
        return 0


NO_TRACING = Tracing()


def available() -> bool:
    """Whether OpenTelemetry's SDK can be imported (the ``otel`` extra is installed)."""
    try:
        return importlib.util.find_spec("opentelemetry.sdk") is not None
    except ModuleNotFoundError:  # no ``opentelemetry`` package at all: its parent is looked up
        return False


def tracing_for(enabled: bool) -> Tracing:
    """Ferry's tracing: off, or OpenTelemetry's as the ``OTEL_*`` variables configure it.
    Raises ``ConfigError`` naming the extra when its packages are missing."""
    if not enabled:
        return NO_TRACING
    if not available():
        raise ConfigError(
            f"enable_tracing needs opentelemetry-sdk, which is not installed: {INSTALL_HINT}"
        )
    from ferry.tracing.export_process import process_tracing

    return process_tracing()
