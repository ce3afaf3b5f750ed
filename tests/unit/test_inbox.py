"""The worker's inbox over a real socket pair: batches in order, cancellations noted when
a streaming handler asks (without waiting), and the ends of the exchange."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from ferry.wire import codec
from ferry.wire.messages import (
    CancelRequests,
    InputPart,
    Message,
    PredictBatch,
    RequestItem,
    StartWorker,
)
from ferry.worker.inbox import Inbox
from tests.fixtures.fake_worker import spec


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, Inbox]]:
    frontend, worker = socket.socketpair()
    with frontend, worker:
        yield frontend, Inbox(worker)


def _batch(batch_id: int, body: bytes = b"x") -> PredictBatch:
    item = RequestItem(f"r{batch_id}", {}, [InputPart("body", "text/plain", body)])
    return PredictBatch(batch_id, [item])


def test_batches_come_in_order_and_cancellations_are_noted_on_the_way(
    pair: tuple[socket.socket, Inbox],
) -> None:
    frontend, inbox = pair
    frames: list[Message] = [_batch(1), CancelRequests(1, ["r1"]), _batch(2)]
    frontend.sendall(b"".join(codec.encode(frame) for frame in frames))
    assert inbox.next_batch() == _batch(1)
    assert inbox.next_batch() == _batch(2)
    # Batch 2 began: batch 1's cancellation is forgotten.
    assert not inbox.is_cancelled(1, "r1")


def test_a_cancellation_is_seen_without_waiting_while_a_batch_runs(
    pair: tuple[socket.socket, Inbox],
) -> None:
    frontend, inbox = pair
    frontend.sendall(codec.encode(_batch(7)))
    assert inbox.next_batch() == _batch(7)
    assert not inbox.is_cancelled(7, "r7"), "nothing arrived: answered at once"
    frontend.sendall(codec.encode(CancelRequests(7, ["r7"])) + codec.encode(_batch(8)))
    assert inbox.is_cancelled(7, "r7")
    assert not inbox.is_cancelled(7, "other")
    assert inbox.next_batch() == _batch(8), "the pipelined batch read on the way is kept"


def test_a_large_frame_arriving_in_pieces_is_one_message(
    pair: tuple[socket.socket, Inbox],
) -> None:
    frontend, inbox = pair
    frame = codec.encode(_batch(3, b"\x01" * (3 << 20)))
    frontend.sendall(frame[:1000])
    assert not inbox.is_cancelled(3, "r3")  # a partial frame is kept, not decoded
    sender = threading.Thread(target=frontend.sendall, args=(frame[1000:],))
    sender.start()  # more than the socket holds: sent while the inbox reads
    assert inbox.next_batch() == _batch(3, b"\x01" * (3 << 20))
    sender.join()


def test_the_spec_is_the_first_message_and_a_spec_later_is_a_protocol_error(
    pair: tuple[socket.socket, Inbox],
) -> None:
    frontend, inbox = pair
    first, later = StartWorker(spec("a")), StartWorker(spec("b"))
    frontend.sendall(codec.encode(first) + codec.encode(later))
    assert inbox.next_message() == first
    with pytest.raises(codec.ProtocolError, match="unexpected StartWorker"):
        inbox.next_batch()


def test_junk_is_a_protocol_error_and_a_closed_socket_the_end(
    pair: tuple[socket.socket, Inbox],
) -> None:
    frontend, inbox = pair
    frontend.sendall(codec.FRAME_HEADER.pack(3) + b"\xc1\xc1\xc1")
    with pytest.raises(codec.ProtocolError):
        inbox.next_batch()
    frontend.close()
    assert inbox.next_batch() is None
    assert not inbox.is_cancelled(1, "r1")
