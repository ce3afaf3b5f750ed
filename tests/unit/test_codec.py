from __future__ import annotations

import dataclasses
import doctest
import enum
import typing
from dataclasses import dataclass, field

import msgpack
import pytest

from ferry.config.image_limits import ImageLimits
from ferry.config.settings import ModelMetric
from ferry.wire import codec, field_codec
from ferry.wire.messages import (
    PROTOCOL_VERSION,
    BatchResult,
    CancelRequests,
    ErrorKind,
    HandlerMetricValue,
    InputPart,
    ItemResult,
    Message,
    PartialResult,
    PredictBatch,
    RequestItem,
    SpecTaken,
    StageWindow,
    StartWorker,
    WorkerLoadFailed,
    WorkerReady,
)
from ferry.wire.spec import HandlerSpec, WorkerSpec

SPEC = WorkerSpec(
    HandlerSpec(
        "m",
        "/models/m",
        "h.py:fn",
        {"model": {"handler": "h.py:fn"}},
        8,
        {"k": [1, 2.5, None], "minWorkers": 2},
        ImageLimits(None, ("PNG",)),
        ["/models/m/packages"],
        "kserve",
        (
            ModelMetric("Requests", "count", "counter", ("ModelName",)),
            ModelMetric("Idle", "ms", "gauge"),
        ),
        "/cache",
    ),
    1,
    2,
    "w0.1",
    "shared",
    "/tmp/keeper.sock",
)

MESSAGES: list[Message] = [
    PredictBatch(
        7,
        [
            RequestItem("r1", {"a": "b"}, [InputPart("body", "image/jpeg", b"\x00\xff")]),
            # The envelope its protocol is read with (KServe V1 here) travels with it.
            RequestItem("r2", {}, [InputPart("body", "application/json", b"{}")], "kserve"),
            RequestItem("r3", {}, [InputPart("a", "text/plain", b"1"), InputPart("b", "", b"")]),
        ],
        # The batch span's context, when it is traced.
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ),
    PredictBatch(8, []),
    BatchResult(
        7,
        [
            ItemResult("r1", b"{}", "application/json", 201, {"x": "y"}),
            ItemResult("r2", b"", "", 0, {}, ErrorKind.INVALID_INPUT, "bad"),
            ItemResult("r3", b"", "", 507, {}, ErrorKind.HANDLER, "out of memory"),
        ],
        1.5,
        [HandlerMetricValue("HandlerTime", 3.5, "ms", "time", {"Level": "Model"})],
        {"preprocess": 1.0, "inference": 0.5},
        [StageWindow("preprocess", 10**18, 10**18 + 10**6), StageWindow("inference", 5, 6)],
    ),
    BatchResult(8, [], 0.0),
    PartialResult(7, "r1", b"part", "text/plain", 200),
    CancelRequests(7, ["r1", "r2"]),
    WorkerReady(1234, "cpu"),
    WorkerReady(1234, "cuda:1", 10**9, 2 * 10**9, 3 * 10**8, "/models/m/w.pt"),
    WorkerLoadFailed("boom"),
    SpecTaken(4321),
    StartWorker(SPEC),
    StartWorker(WorkerSpec(HandlerSpec("m", "/m", "h.py", {}, 1, {}), None, 1, "w0")),  # defaults
]


def _payload(message: Message) -> bytes:
    frame = codec.encode(message)
    header, payload = frame[: codec.FRAME_HEADER.size], frame[codec.FRAME_HEADER.size :]
    assert codec.frame_length(header) == len(payload)
    return payload


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: Message) -> None:
    decoded = codec.decode(_payload(message))
    assert decoded == message and type(decoded) is type(message)


def test_every_message_has_a_tag_and_a_round_trip_here() -> None:
    kinds = set(typing.get_args(Message))
    assert set(codec.TAGS) == kinds and len(set(codec.TAGS.values())) == len(kinds)
    assert {type(message) for message in MESSAGES} == kinds


def test_the_decoded_values_have_their_declared_types() -> None:
    decoded = codec.decode(_payload(StartWorker(SPEC)))
    assert isinstance(decoded, StartWorker)
    assert type(decoded.spec.model) is HandlerSpec
    assert decoded.spec.model.model_metrics[0].dimensions == ("ModelName",)  # tuples, not lists
    assert decoded.spec.model.image_limits.formats == ("PNG",)
    result = codec.decode(_payload(MESSAGES[2]))
    assert isinstance(result, BatchResult)
    assert [r.error_kind for r in result.results] == list(ErrorKind)


def test_a_batch_is_an_array_of_its_fields_in_order() -> None:
    """The frame's layout, pinned: changing it means a new PROTOCOL_VERSION."""
    batch = PredictBatch(7, [RequestItem("r1", {"a": "b"}, [InputPart("body", "t", b"x")])])
    assert msgpack.unpackb(_payload(batch)) == [
        PROTOCOL_VERSION,
        codec.TAGS[PredictBatch],
        7,
        [["r1", {"a": "b"}, [["body", "t", b"x"]], ""]],
        "",
    ]
    answer = BatchResult(7, [ItemResult("r1", b"y", "t", 0, {}, ErrorKind.HANDLER, "m")], 1.5)
    assert msgpack.unpackb(_payload(answer)) == [
        PROTOCOL_VERSION,
        codec.TAGS[BatchResult],
        7,
        [["r1", b"y", "t", 0, {}, "handler", "m"]],
        1.5,
        [],
        {},
        [],
    ]


def test_the_spec_carries_its_handler_part_whole_as_one_nested_array() -> None:
    """``StartWorker``'s layout, pinned: the handler's part (``HandlerSpec``) is one array
    in the spec's, ahead of the process's fields, and comes back a ``HandlerSpec``."""
    model = HandlerSpec("m", "/m", "h.py", {}, 1, {"k": 1}, ImageLimits(None, ("PNG",)), [], "", ())
    message = StartWorker(WorkerSpec(model, 0, 2, "w0.1"))
    handler_part = ["m", "/m", "h.py", {}, 1, {"k": 1}, [None, ["PNG"]], [], "", [], ""]
    assert msgpack.unpackb(_payload(message)) == [
        PROTOCOL_VERSION,
        codec.TAGS[StartWorker],
        [handler_part, 0, 2, "w0.1", "", ""],
    ]
    spec_codec = field_codec.class_codec(HandlerSpec)
    assert spec_codec.decode(msgpack.unpackb(msgpack.packb(spec_codec.encode(model)))) == model


def test_other_protocol_version_is_refused() -> None:
    payload = msgpack.packb([PROTOCOL_VERSION - 1, codec.TAGS[WorkerReady], 1, "cpu", 0, 0, 0, ""])
    with pytest.raises(codec.ProtocolError, match=f"version {PROTOCOL_VERSION - 1}, expected"):
        codec.decode(payload)


def test_an_unknown_tag_is_refused() -> None:
    with pytest.raises(codec.ProtocolError, match="unknown message kind 42"):
        codec.decode(msgpack.packb([PROTOCOL_VERSION, 42]))
    with pytest.raises(codec.ProtocolError, match="unknown message kind"):
        codec.decode(msgpack.packb([PROTOCOL_VERSION, [1], "a kind that is no number"]))


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_truncated_frame_is_refused(message: Message) -> None:
    payload = _payload(message)
    for length in sorted({0, 1, len(payload) // 2, len(payload) - 1}):
        with pytest.raises(codec.ProtocolError, match="undecodable frame"):
            codec.decode(payload[:length])


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ([codec.TAGS[WorkerReady], "only-one-field"], "WorkerReady takes an array of 6 fields"),
        ([codec.TAGS[SpecTaken], 1, 2], "SpecTaken takes an array of 1 fields, not 2"),
        ([codec.TAGS[StartWorker], {"model_name": "m"}], "WorkerSpec takes an array of"),
        ([codec.TAGS[CancelRequests], 1, "not-a-list"], "expected an array, not a str"),
        # An item without its envelope.
        ([codec.TAGS[PredictBatch], 7, [["r1", {}, []]], ""], "not enough values"),
        (
            [codec.TAGS[BatchResult], 7, [["r", b"", "", 0, {}, "oops", ""]], 1.0, [], {}, []],
            "oops",
        ),
    ],
)
def test_a_malformed_message_is_refused(fields: list[object], says: str) -> None:
    with pytest.raises(codec.ProtocolError, match="malformed") as raised:
        codec.decode(msgpack.packb([PROTOCOL_VERSION, *fields]))
    assert says in str(raised.value)


def test_garbage_is_refused() -> None:
    with pytest.raises(codec.ProtocolError, match="undecodable"):
        codec.decode(b"\xc1")
    with pytest.raises(codec.ProtocolError, match="undecodable"):
        codec.decode(msgpack.packb({"version": PROTOCOL_VERSION}))
    with pytest.raises(codec.ProtocolError, match="undecodable"):
        codec.decode(msgpack.packb([PROTOCOL_VERSION]))


def test_an_answer_msgpack_cannot_carry_fails_to_encode_and_the_next_one_is_whole() -> None:
    unsendable = ItemResult("r", b"", "", 200, {"x": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        codec.encode(BatchResult(1, [unsendable], 1.0))
    assert codec.decode(_payload(SpecTaken(5))) == SpecTaken(5)


# --- the codec derived from a dataclass ----------------------------------------------------


class Colour(enum.Enum):
    RED = 1
    BLUE = 2


@dataclass(frozen=True)
class Leaf:
    name: str
    colour: Colour = Colour.RED


@dataclass(frozen=True)
class Tree:
    leaves: tuple[Leaf, ...]
    best: Leaf
    counts: dict[str, list[int]] = field(default_factory=dict)
    weight: float | None = None


def test_nested_dataclasses_tuples_and_plain_enums_round_trip() -> None:
    tree = Tree((Leaf("a"), Leaf("b", Colour.BLUE)), Leaf("c"), {"x": [1, 2]}, 0.5)
    codec_ = field_codec.class_codec(Tree)
    wire = msgpack.unpackb(msgpack.packb(codec_.encode(tree)))
    assert wire == [[["a", 1], ["b", 2]], ["c", 1], {"x": [1, 2]}, 0.5]
    assert codec_.decode(wire) == tree


def test_a_value_no_member_of_the_enum_has_is_refused() -> None:
    with pytest.raises(KeyError):
        field_codec.class_codec(Leaf).decode(["a", 3])


def test_a_field_type_without_a_wire_form_is_refused_when_the_codec_is_built() -> None:
    @dataclass
    class Odd:
        when: set[int]

    with pytest.raises(TypeError, match="no wire form for fields of type set"):
        field_codec.class_codec(Odd)


@dataclass(frozen=True)
class Checked:
    size: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError("a negative size")


def test_a_dataclass_that_checks_its_fields_is_built_through_its_constructor() -> None:
    assert field_codec.class_codec(Checked).decode([1]) == Checked(1)
    with pytest.raises(ValueError, match="a negative size"):
        field_codec.class_codec(Checked).decode([-1])


def test_decoded_messages_are_whole_dataclasses() -> None:
    """Built without their ``__init__`` (``field_codec._builder``): nothing is missing."""
    decoded = codec.decode(_payload(MESSAGES[2]))
    assert isinstance(decoded, BatchResult)
    assert (
        decoded.results[0].__dict__
        == ItemResult("r1", b"{}", "application/json", 201, {"x": "y"}).__dict__
    )
    assert hash(decoded.stage_windows[0]) == hash(StageWindow("preprocess", 10**18, 10**18 + 10**6))
    assert dataclasses.replace(decoded, batch_id=9).results == decoded.results


def test_the_modules_example_holds() -> None:
    assert doctest.testmod(field_codec, extraglobs={"ImageLimits": ImageLimits}).failed == 0


def test_a_large_frame_does_not_keep_its_packer() -> None:
    big = PartialResult(1, "r", b"x" * (codec._PACKER_KEPT_UP_TO + 1), "application/octet-stream")
    assert codec.decode(_payload(big)) == big
    assert not hasattr(codec._packers, "packer")
    assert codec.decode(_payload(SpecTaken(5))) == SpecTaken(5)
    assert hasattr(codec._packers, "packer")
