"""What the frontend sends a worker: batches, and word of clients that hung up.

Between batches the main loop blocks for the next frame (``next_batch``). While a batch
runs, the frontend may send ``CancelRequests`` (and the next batch, pipelined); they are
read when the handler streams its next part, which asks ``is_cancelled``: a read that
never blocks takes whatever frames have arrived. So a cancellation reaches a streaming
handler on its next part, with no reader thread: handing every batch from a thread to the
main one cost the no-op model 4% of its requests/s.
"""

from __future__ import annotations

import socket
import threading
from collections import deque

from ferry.wire import codec
from ferry.wire.messages import CancelRequests, Message, PredictBatch

_CHUNK = 1 << 16
_MAX_READ = 1 << 22


class Inbox:
    """The frames of one worker's socket, read from whichever thread asks, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._frames: deque[Message] = deque()
        self._cancelled: dict[int, set[str]] = {}
        self._closed = False
        self._lock = threading.Lock()
        """Held while reading: stage threads of a pipelined handler stream in parallel."""

    def next_message(self) -> Message | None:
        """The next frame of any kind, waiting for it; None once the frontend has gone.
        Raises ``codec.ProtocolError`` for a frame that is not this protocol."""
        with self._lock:
            while not self._frames:
                if not self._receive(block=True):
                    return None
            return self._frames.popleft()

    def next_batch(self) -> PredictBatch | None:
        """The next batch (cancellations read on the way are noted); None once the
        frontend has gone."""
        while (message := self.next_message()) is not None:
            if isinstance(message, PredictBatch):
                self._forget_before(message.batch_id)
                return message
            raise codec.ProtocolError(f"worker got unexpected {type(message).__name__}")
        return None

    def is_cancelled(self, batch_id: int, request_id: str) -> bool:
        """Whether the client of ``request_id`` in batch ``batch_id`` hung up, as far as
        the frames that have arrived tell (read now, without waiting)."""
        with self._lock:
            if not self._closed:
                self._receive(block=False)
            return request_id in self._cancelled.get(batch_id, ())

    def _forget_before(self, batch_id: int) -> None:
        """Cancellations of batches already answered (they crossed the answer) go."""
        with self._lock:
            for old in [b for b in self._cancelled if b < batch_id]:
                del self._cancelled[old]

    def _receive(self, *, block: bool) -> bool:
        """Read what the socket has (waiting for at least one byte if ``block``) and
        take the whole frames out of it; False once the frontend closed the socket."""
        while True:
            try:
                data = self._sock.recv(self._wanted(), 0 if block else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            if not data:
                self._closed = True
                return False
            self._buffer += data
            self._take_frames()
            if block and self._frames:
                return True

    def _wanted(self) -> int:
        """Bytes to ask for: the rest of the frame being read, in bounded reads."""
        if len(self._buffer) < codec.FRAME_HEADER.size:
            return _CHUNK
        length = codec.frame_length(bytes(self._buffer[: codec.FRAME_HEADER.size]))
        missing = codec.FRAME_HEADER.size + length - len(self._buffer)
        return min(max(missing, _CHUNK), _MAX_READ)

    def _take_frames(self) -> None:
        header = codec.FRAME_HEADER.size
        while len(self._buffer) >= header:
            length = codec.frame_length(bytes(self._buffer[:header]))
            if len(self._buffer) < header + length:
                return
            payload = bytes(self._buffer[header : header + length])
            del self._buffer[: header + length]
            message = codec.decode(payload)
            if isinstance(message, CancelRequests):
                self._cancelled.setdefault(message.batch_id, set()).update(message.request_ids)
            else:
                self._frames.append(message)
