"""What a payload can make the worker's decoding, the handler or the answer's encoding
raise, and the V2 tensor payload between frontend and worker (issue 29, defects 1 and 6)."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from ferry.errors import InvalidInput, RequestTooLarge
from ferry.handlers.contract.context import Context
from ferry.protocols import tensor_bytes, untrusted_json, v2
from ferry.wire.messages import InputPart, PredictBatch, RequestItem
from ferry.worker.payloads import encode_output, request_row
from ferry.worker.runner import BatchRunner

DEEP = b"[" * 100_000 + b"]" * 100_000


def _item(request_id: str, body: bytes, content_type: str = "application/json") -> RequestItem:
    return RequestItem(request_id, {}, [InputPart("body", content_type, body)])


def _runner(entry: Any) -> BatchRunner:
    return BatchRunner(entry, Context("m", "/", {}, 4, None))


def _echo(data: list[dict[str, Any]], context: Context) -> list[Any]:
    return [row["body"] for row in data]


def test_deep_json_is_one_value_error() -> None:
    with pytest.raises(untrusted_json.UndecodableJson, match="nested too deeply"):
        untrusted_json.loads(DEEP)
    with pytest.raises(ValueError):
        untrusted_json.loads(b"\xff{")  # not UTF-8


def test_a_deep_body_is_invalid_input_for_its_request_alone() -> None:
    batch = PredictBatch(1, [_item("a", b"[1]"), _item("deep", DEEP), _item("c", b"{}")])
    results = _runner(_echo).run(batch).results
    assert [(r.request_id, r.error_kind) for r in results] == [
        ("a", ""),
        ("deep", "invalid_input"),
        ("c", ""),
    ]
    assert "nested too deeply" in results[1].message
    assert [results[0].body, results[2].body] == [b"[1]", b"{}"]


@pytest.mark.parametrize("raised", [RecursionError("deep"), MemoryError(), KeyError("x")])
def test_whatever_the_handler_raises_fails_only_its_requests(raised: Exception) -> None:
    def handle(data: list[dict[str, Any]], context: Context) -> list[Any]:
        raise raised

    results = _runner(handle).run(PredictBatch(1, [_item("a", b"1")])).results
    assert results[0].error_kind == "handler"
    assert type(raised).__name__ in results[0].message


def test_an_answer_nested_too_deeply_to_write_is_a_failed_request() -> None:
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(ValueError, match="nested too deeply"):
        encode_output(nested, None)

    def handle(data: list[dict[str, Any]], context: Context) -> list[Any]:
        return [nested for _ in data]

    results = _runner(handle).run(PredictBatch(1, [_item("a", b"1")])).results
    assert results[0].error_kind == "handler" and "nested too deeply" in results[0].message


def test_a_failure_outside_the_handler_still_answers_every_request() -> None:
    runner = _runner(_echo)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("decoding bug")

    runner._run_items = broken  # type: ignore[method-assign]
    results = runner.run(PredictBatch(7, [_item("a", b"1"), _item("b", b"2")])).results
    assert [(r.request_id, r.error_kind) for r in results] == [("a", "handler"), ("b", "handler")]
    failed = runner.failed(PredictBatch(8, [_item("c", b"3")]), TypeError("unframeable"))
    assert failed.batch_id == 8 and "unframeable" in failed.results[0].message


# --- the V2 tensor payload ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "values"),
    [
        ("BOOL", [True, False, True]),
        ("UINT8", [0, 255]),
        ("UINT16", [0, 65535]),
        ("UINT32", [0, 2**32 - 1]),
        ("UINT64", [0, 2**64 - 1]),
        ("INT8", [-128, 127]),
        ("INT16", [-(2**15), 2**15 - 1]),
        ("INT32", [-(2**31), 2**31 - 1]),
        ("INT64", [-(2**63), 2**63 - 1]),
        ("FP16", [0.5, -2.0]),
        ("FP32", [1.5, -3.25]),
        ("FP64", [1e300, -0.1]),
        ("BF16", [1.5, -2.0]),
        ("BYTES", ["abc", ""]),
    ],
)
def test_bytes_unpack_to_the_values_they_were_packed_from(datatype: str, values: list[Any]) -> None:
    raw = tensor_bytes.encode(values, datatype)
    assert tensor_bytes.element_count(raw, datatype, "x") == len(values)
    unpacked = tensor_bytes.to_list(raw, datatype, "x")
    if datatype == "BYTES":  # JSON carries bytes as base64, as KServe's wrapper did
        assert unpacked == ["YWJj", ""]
    else:
        assert unpacked == values
        assert all(type(a) is type(b) for a, b in zip(unpacked, values, strict=True))


def test_any_non_zero_byte_is_a_true_bool() -> None:
    assert tensor_bytes.to_list(b"\x00\x02\xff", "BOOL", "x") == [False, True, True]


def test_bytes_that_are_no_whole_elements_are_invalid() -> None:
    with pytest.raises(InvalidInput, match="whole number of FP32"):
        tensor_bytes.element_count(b"\x00" * 6, "FP32", "x")
    with pytest.raises(InvalidInput, match="cut off"):
        tensor_bytes.element_count(b"\x01\x00", "BYTES", "x")
    with pytest.raises(InvalidInput, match="runs past"):
        tensor_bytes.element_count(struct.pack("<I", 9) + b"ab", "BYTES", "x")


def _binary_body(inputs: list[tuple[str, str, list[int], bytes]]) -> tuple[bytes, str]:
    entries = [
        {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(raw)}}
        for n, d, s, raw in inputs
    ]
    header = json.dumps({"inputs": entries}).encode()
    return header + b"".join(raw for *_, raw in inputs), str(len(header))


def test_binary_inputs_stay_bytes_in_the_frontend_and_unpack_in_the_worker() -> None:
    floats = np.arange(6, dtype="<f4")
    body, length = _binary_body(
        [("x", "FP32", [2, 3], floats.tobytes()), ("m", "BOOL", [2], b"\x01\x00")]
    )
    request = v2.parse_request(body, length)
    assert all(t.data == [] and t.raw is not None for t in request.inputs)
    payload, content_type = request.worker_payload()
    assert len(payload) < len(body) + 200, "the bytes travel as they came"
    row = request_row(_item("r", payload, content_type))
    assert row["body"] == request.handler_document()
    assert row["body"]["inputs"][0]["data"] == floats.tolist()
    assert row["body"]["inputs"][1]["data"] == [True, False]


def test_element_budget_refuses_by_declared_shape_before_decoding() -> None:
    body, length = _binary_body([("x", "BOOL", [6_000_000], b"\x01")])
    with pytest.raises(RequestTooLarge, match="max_tensor_elements"):
        v2.parse_request(body, length, max_elements=1_000_000)
    # Within the budget the same short data is a plain shape mismatch.
    with pytest.raises(InvalidInput, match="holds 6000000 elements"):
        v2.parse_request(body, length, max_elements=6_000_000)


def test_element_budget_counts_every_input_together() -> None:
    body, length = _binary_body(
        [("a", "UINT8", [3], b"\x01\x02\x03"), ("b", "UINT8", [3], b"\x04\x05\x06")]
    )
    assert len(v2.parse_request(body, length, max_elements=6).inputs) == 2
    with pytest.raises(RequestTooLarge, match="input 'b'"):
        v2.parse_request(body, length, max_elements=5)


def test_a_request_too_deep_to_pack_is_invalid_input() -> None:
    nested: Any = 1
    for _ in range(100_000):
        nested = {"a": nested}
    request = v2.InferRequest(None, {"deep": nested}, [], [], binary_outputs=False)
    with pytest.raises(InvalidInput, match="nested too deeply"):
        request.worker_payload()


def test_a_garbled_tensor_payload_is_invalid_input() -> None:
    item = _item("r", b"{not json", f"{tensor_bytes.PAYLOAD_TYPE}; json-length=9")
    with pytest.raises(InvalidInput, match="cannot be decoded"):
        request_row(item)
