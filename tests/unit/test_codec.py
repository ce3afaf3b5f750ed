from __future__ import annotations

import msgpack
import pytest

from ferry.wire import codec
from ferry.wire.messages import (
    PROTOCOL_VERSION,
    BatchResult,
    CancelRequests,
    HandlerMetricValue,
    InputPart,
    ItemResult,
    PartialResult,
    PredictBatch,
    RequestItem,
    SpecTaken,
    StageWindow,
    StartWorker,
    WorkerLoadFailed,
    WorkerReady,
)

MESSAGES = [
    PredictBatch(
        7,
        [
            RequestItem("r1", {"a": "b"}, [InputPart("body", "image/jpeg", b"\x00\xff")]),
            # The envelope its protocol is read with (KServe V1 here) travels with it.
            RequestItem("r2", {}, [InputPart("body", "application/json", b"{}")], "kserve"),
        ],
        # The batch span's context, when it is traced.
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ),
    BatchResult(
        7,
        [
            ItemResult("r1", b"{}", "application/json", 201, {"x": "y"}),
            ItemResult("r2", b"", "", 0, {}, "invalid_input", "bad"),
        ],
        1.5,
        [HandlerMetricValue("HandlerTime", 3.5, "ms", "time", {"Level": "Model"})],
        {"preprocess": 1.0, "inference": 0.5},
        [StageWindow("preprocess", 10**18, 10**18 + 10**6), StageWindow("inference", 5, 6)],
    ),
    PartialResult(7, "r1", b"part", "text/plain", 200),
    CancelRequests(7, ["r1", "r2"]),
    WorkerReady(1234, "cpu"),
    WorkerLoadFailed("boom"),
    SpecTaken(4321),
    StartWorker({"model_name": "m", "model_yaml_config": {"k": [1, 2.5, None]}}),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: object) -> None:
    frame = codec.encode(message)  # type: ignore[arg-type]
    header, payload = frame[: codec.FRAME_HEADER.size], frame[codec.FRAME_HEADER.size :]
    assert codec.frame_length(header) == len(payload)
    assert codec.decode(payload) == message


def test_other_protocol_version_is_refused() -> None:
    payload = msgpack.packb([99, 3, 1, "cpu"])
    with pytest.raises(codec.ProtocolError, match="version 99"):
        codec.decode(payload)


def test_garbage_and_unknown_kinds_are_refused() -> None:
    with pytest.raises(codec.ProtocolError):
        codec.decode(b"\xc1")
    with pytest.raises(codec.ProtocolError, match="unknown message kind"):
        codec.decode(msgpack.packb([PROTOCOL_VERSION, 42]))
    with pytest.raises(codec.ProtocolError, match="malformed"):
        codec.decode(msgpack.packb([PROTOCOL_VERSION, 3, "only-one-field"]))
    with pytest.raises(codec.ProtocolError, match="malformed"):
        codec.decode(msgpack.packb([PROTOCOL_VERSION, 5, "not-a-mapping"]))
    with pytest.raises(codec.ProtocolError, match="malformed"):
        codec.decode(msgpack.packb([PROTOCOL_VERSION, 7, 1, "not-a-list"]))
    with pytest.raises(codec.ProtocolError, match="unknown message kind"):
        codec.decode(msgpack.packb([PROTOCOL_VERSION, [1], "a kind that is no number"]))
    with pytest.raises(codec.ProtocolError, match="malformed"):  # an item without its envelope
        codec.decode(msgpack.packb([PROTOCOL_VERSION, 1, 7, [["r1", {}, []]]]))
