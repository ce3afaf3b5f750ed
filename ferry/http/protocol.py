"""uvicorn's httptools protocol with the limits it lacks: head size and count, head and
body timeouts, and TorchServe's JSON body on the errors it answers itself.

httptools (llhttp) has no header limit and gathers a header value (or the URL) piece by
piece in Python, so an endless header costs quadratic time on the event loop. Here the
bytes of a request head are counted as they arrive and never more than
``HttpLimits.max_header_size`` is handed to the parser:

- a head over ``max_header_size`` bytes, or with over ``max_headers`` fields, gets 431;
- chunked trailers (headers after the body) get the same byte budget;
- a request the parser rejects (bad request line, method, header, chunk) gets 400;
- a head not complete within ``header_timeout`` seconds gets 408 (a fresh connection that
  sent nothing is closed silently, as uvicorn closes idle keep-alive connections);
- a body that makes no progress for ``body_read_timeout`` seconds gets 408, like nginx's
  ``client_body_timeout`` (time the server itself stops reading does not count).

Each answer carries TorchServe's JSON body and ``Connection: close``; the connection is
then closed (a lingering close: see ``LINGER_SECONDS``). A normal request costs one clock
read and a few counters; the one timer per connection is armed at its start and again
only when a read leaves a head or body incomplete.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from ferry.http.hang_up import notify_hang_up


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP/1.1 connection may send; the values come from ``ServerSettings``
    (its fields of the same names say more)."""

    max_header_size: int
    """Bytes of request line plus header fields (and, separately, of chunked trailers)."""
    max_headers: int
    """Header fields in one request head."""
    header_timeout: float
    """Seconds from a head's first byte (or the connection's start) to its end."""
    body_read_timeout: float
    """Seconds a pending request body may go without a byte arriving."""


LINGER_SECONDS = 2.0
"""After an error answer, how long input is still read (and discarded) so that closing
does not reset the connection before the client has read the answer."""


class LimitedConfig(uvicorn.Config):
    """uvicorn's ``Config`` serving with ``LimitedHttpProtocol`` under ``limits``."""

    def __init__(self, app: Any, *, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(app, http=LimitedHttpProtocol, **kwargs)
        self.limits = limits


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing and answer ``status``."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.answer = (status, error_type, message)


def _too_large(message: str) -> _Refused:
    return _Refused(431, "RequestHeaderFieldsTooLargeException", message)


def error_bytes(
    status: int, error_type: str, message: str, default_headers: list[tuple[bytes, bytes]]
) -> bytes:
    """A complete ``Connection: close`` response with TorchServe's error body."""
    body = json.dumps({"code": status, "type": error_type, "message": message}).encode()
    head = [STATUS_LINE[status]]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


class LimitedHttpProtocol(HttpToolsProtocol):
    """One connection, parsed by httptools within ``LimitedConfig.limits``."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not isinstance(config, LimitedConfig):
            raise TypeError("LimitedHttpProtocol needs a LimitedConfig (it holds the limits)")
        super().__init__(config, server_state, app_state, _loop)
        self.limits = config.limits
        self._head_pending = True  # between one message's end and the next head's end
        self._head_bytes = 0  # bytes received for the pending head (0: not started)
        self._head_started: float | None = None  # when the pending head began, once known
        self._body_pending = False  # between a head's end and its message's end
        self._body_activity = 0.0  # when body bytes last arrived (or reading resumed)
        self._body_seen = False  # whether the read being parsed carried body bytes
        self._trailer_bytes = 0  # bytes of reads that carried no body, since the last that did
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False  # answered an error (or upgraded): input is not parsed

    # Connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_started = self.loop.time()
        self._timer = self.loop.call_later(self.limits.header_timeout, self._check_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        cycle = getattr(self, "cycle", None)
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            notify_hang_up(cycle.scope)  # a request still waiting for its answer is dropped

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering after an answer: discarded unparsed
        self._unset_keepalive_if_required()
        if self._body_pending:
            self._receive_body(data)
        elif len(data) <= self.limits.max_header_size - self._head_bytes:
            self._head_bytes += len(data)  # the usual case: a whole head in one read
            self._feed(data)
        else:
            self._receive_long_head(data)
        if self._head_bytes or self._body_pending:  # this read left a request incomplete
            self._note_incomplete()

    def _receive_long_head(self, data: bytes) -> None:
        """Feed no more of a head than ``max_header_size``; what follows a head's end in
        the same read (its body, the next request) is fed on."""
        limit = self.limits.max_header_size
        while self._head_pending and data:
            room = limit - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                self._feed(data)
                return
            self._head_bytes = limit
            head, data = data[:room], data[room:]
            if not self._feed(head):
                return
            if self._head_pending and self._head_bytes == limit:  # the same head goes on
                self._refuse(*_too_large(f"request head over {limit} bytes").answer)
                return
        if data:  # the head ended within the read: the rest is its body
            self._receive_body(data)

    def _receive_body(self, data: bytes) -> None:
        """Feed body bytes, counting reads that carry none: after the last chunk those are
        trailers, which httptools gathers like headers."""
        self._body_seen = False
        if not self._feed(data) or not self._body_pending:
            return
        if self._body_seen:
            self._trailer_bytes = 0
            return
        self._trailer_bytes += len(data)
        if self._trailer_bytes > self.limits.max_header_size:
            limit = self.limits.max_header_size
            message = f"over {limit} bytes of chunk framing or trailers without body data"
            self._refuse(*_too_large(message).answer)

    def _feed(self, data: bytes) -> bool:
        """Parse ``data``; False when the connection is done with (refused or upgraded)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():  # the connection is the WebSocket protocol's now
                self._refused = True
                self._cancel_timer()
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError as error:
            cause = error.__context__  # what a callback raised (e.g. a URL it cannot parse)
            if isinstance(cause, _Refused):
                self._refuse(*cause.answer)
            else:
                self.logger.warning("Invalid HTTP request received: %s", cause or error)
                self._refuse(400, "BadRequestException", f"Invalid HTTP request: {cause or error}")
            return False
        return not self._refused and not self.transport.is_closing()

    # Parser callbacks (uvicorn's, plus the state the limits need)

    def on_headers_complete(self) -> None:
        if len(self.headers) > self.limits.max_headers:
            raise _too_large(f"over {self.limits.max_headers} header fields")
        super().on_headers_complete()  # may raise (a URL httptools cannot parse): still a head
        self._head_pending = False
        self._body_pending = True

    def on_body(self, body: bytes) -> None:
        self._body_seen = True
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_pending = False
        self._head_pending = True
        self._head_bytes = 0
        self._head_started = None
        self._trailer_bytes = 0
        super().on_message_complete()
        if self.cycle.response_complete and not self.pipeline:
            self._rearm_keep_alive()

    def _rearm_keep_alive(self) -> None:
        """The answer went before the body ended: uvicorn armed its keep-alive timeout with
        the answer and cancelled it on the next read (the rest of the body), and arms it
        again only with an answer; without this the idle connection stays open for ever."""
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    # Answers

    def send_400_response(self, msg: str) -> None:
        """uvicorn's plain-text 400, as TorchServe's JSON body."""
        self._refuse(400, "BadRequestException", msg)

    def _refuse(self, status: int, error_type: str, message: str) -> None:
        """Answer ``status`` and close; only close when a response is already under way
        on this connection (its bytes must not mix with ours)."""
        if self._refused or self.transport.is_closing():
            return
        self._refused = True
        self._cancel_timer()
        cycle = self.cycle
        if cycle is None:
            can_answer = True
        elif self._head_pending:  # ``cycle`` is the previous request's
            can_answer = cycle.response_complete
        else:
            can_answer = not cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app reads a disconnect; what it sends is dropped
            cycle.message_event.set()
        if can_answer and not self.pipeline:
            defaults = self.server_state.default_headers
            self.transport.write(error_bytes(status, error_type, message, defaults))
            if self.transport.can_write_eof():  # not over TLS
                self._linger()
                return
        self.transport.close()

    def _linger(self) -> None:
        """A lingering close: closing with input unread would reset the connection, which
        can destroy the answer before the client reads it; so end our side, discard what
        still comes, and close on the client's end or after ``LINGER_SECONDS``."""
        self.transport.write_eof()
        self.flow.resume_reading()
        self._timer = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    # The one timer: head and body deadlines

    def _note_incomplete(self) -> None:
        """Start the head's clock (with the read that began it), note body progress, and
        arm the timer if it is not."""
        if self._refused or self.transport.is_closing():
            return
        now = self.loop.time()
        if self._body_pending:
            self._body_activity = now
            if self._timer is None:
                self._arm(self.limits.body_read_timeout)
            return
        if self._head_started is None:
            self._head_started = now
        if self._timer is None:
            self._arm(self._head_started + self.limits.header_timeout - now)

    def _arm(self, delay: float) -> None:
        self._timer = self.loop.call_later(max(delay, 0.0), self._check_deadline)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_deadline(self) -> None:
        """Refuse a head or body that is late; otherwise re-arm for the time left, or stay
        unarmed while neither is pending (uvicorn's keep-alive timeout covers idleness)."""
        self._timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if self._body_pending:
            if self.flow.read_paused or self.cycle.waiting_for_100_continue:
                self._body_activity = now  # waiting on us, not on the client
            left = self._body_activity + self.limits.body_read_timeout - now
            if left <= 0:
                timeout = self.limits.body_read_timeout
                message = f"request body not received: no data for {timeout:g}s"
                self._refuse(408, "RequestTimeoutException", message)
                return
        elif self._head_pending and (self._head_bytes or self.cycle is None):
            if self.flow.read_paused or self._head_started is None:
                self._head_started = now  # a pipelined request waits for the one before
            left = self._head_started + self.limits.header_timeout - now
            if left <= 0:
                self._head_timed_out()
                return
        else:
            return
        self._arm(left)

    def _head_timed_out(self) -> None:
        if not self._head_bytes:  # a connection that never sent a byte: just close it
            self._cancel_timer()
            self.transport.close()
            return
        timeout = self.limits.header_timeout
        message = f"request head not received within {timeout:g}s"
        self._refuse(408, "RequestTimeoutException", message)


__all__ = ["HttpLimits", "LimitedConfig", "LimitedHttpProtocol", "error_bytes"]
