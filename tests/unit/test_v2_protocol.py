"""``ferry.protocols.v2``: the Open Inference Protocol's tensors, JSON and binary."""

from __future__ import annotations

import json
import struct

import pytest

from ferry.errors import InvalidInput, RequestTooLarge
from ferry.protocols import v2


def _request(*inputs: dict[str, object], **extra: object) -> v2.InferRequest:
    return v2.parse_request(json.dumps({"inputs": list(inputs), **extra}).encode(), None)


def test_nested_data_is_flattened_and_checked_against_the_shape() -> None:
    request = _request(
        {"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}
    )
    (tensor,) = request.inputs
    assert tensor.data == [1, 2, 3, 4] and tensor.shape == [2, 2]
    assert request.handler_document() == {
        "inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}]
    }


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ({"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}, "holds 3 elements"),
        ({"name": "x", "shape": [1], "datatype": "UINT8", "data": [-1]}, "not a valid UINT8"),
        ({"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}, "not a valid BOOL"),
        ({"name": "x", "shape": [1], "datatype": "BYTES", "data": [1]}, "not a valid BYTES"),
        ({"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}, "whole numbers"),
        ({"name": "x", "shape": [1], "datatype": "FP32"}, "neither 'data' nor"),
        ({"shape": [1], "datatype": "FP32", "data": [1]}, "needs a 'name'"),
    ],
)
def test_invalid_tensors_name_the_problem(tensor: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        _request(tensor)


def test_a_bytes_input_shaped_minus_one_takes_its_size_from_the_data() -> None:
    """TorchServe's KServe sample (``mnist_v2_bytes.json``): one base64 image in a BYTES
    input of shape [-1]; the handler gets the size the data gives."""
    image = "aGVsbG8gaW1hZ2U="
    request = _request({"name": "img-7", "shape": [-1], "datatype": "BYTES", "data": [image]})
    assert request.handler_document() == {
        "inputs": [{"name": "img-7", "shape": [1], "datatype": "BYTES", "data": [image]}]
    }
    pair = _request({"name": "w", "shape": [2, -1], "datatype": "BYTES", "data": list("abcdef")})
    assert pair.inputs[0].shape == [2, 3]
    empty = _request({"name": "w", "shape": [-1], "datatype": "BYTES", "data": []})
    assert empty.inputs[0].shape == [0]


def test_a_binary_bytes_input_shaped_minus_one_is_sized_by_its_elements() -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "w",
                    "shape": [-1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 13},
                }
            ]
        }
    ).encode()
    blob = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 3) + b"abc"
    (tensor,) = v2.parse_request(header + blob, str(len(header))).inputs
    assert tensor.shape == [2] and tensor.elements() == ["aGk=", "YWJj"]


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ({"name": "w", "shape": [-1, -1], "datatype": "BYTES", "data": ["a"]}, "one -1, not 2"),
        (
            {"name": "w", "shape": [2, -1], "datatype": "BYTES", "data": ["a"]},
            "fits the data's element count, 1",
        ),
        (
            {"name": "w", "shape": [0, -1], "datatype": "BYTES", "data": []},
            "fits the data's element count, 0",
        ),
        ({"name": "w", "shape": [-2], "datatype": "BYTES", "data": ["a"]}, "whole numbers"),
        ({"name": "x", "shape": [-1], "datatype": "INT64", "data": [1]}, "BYTES inputs only"),
    ],
)
def test_minus_one_is_for_one_dimension_of_a_bytes_input(
    tensor: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        _request(tensor)


def test_a_bytes_input_sized_by_its_data_still_counts_towards_the_element_limit() -> None:
    document = {"inputs": [{"name": "w", "shape": [-1], "datatype": "BYTES", "data": ["a"] * 5}]}
    body = json.dumps(document).encode()
    assert v2.parse_request(body, None, max_elements=5).inputs[0].shape == [5]
    with pytest.raises(RequestTooLarge, match="more than 4 elements"):
        v2.parse_request(body, None, max_elements=4)


def test_binary_tensors_follow_the_json_header() -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "f",
                    "shape": [2],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 8},
                },
                {
                    "name": "b",
                    "shape": [2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 11},
                },
                {
                    "name": "h",
                    "shape": [1],
                    "datatype": "BF16",
                    "parameters": {"binary_data_size": 2},
                },
            ]
        }
    ).encode()
    blobs = (
        struct.pack("<2f", 1.5, -2.0)
        + struct.pack("<I", 3)
        + b"abc"
        + struct.pack("<I", 0)
        + struct.pack("<H", 0x3FC0)  # bfloat16 1.5
    )
    request = v2.parse_request(header + blobs, str(len(header)))
    f, b, h = request.inputs
    assert f.elements() == [1.5, -2.0]
    assert b.elements() == ["YWJj", ""]  # base64 of b"abc", and an empty element
    assert h.elements() == [1.5]
    assert "binary_data_size" not in f.parameters


def test_binary_sizes_must_add_up() -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "f",
                    "shape": [1],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 4},
                }
            ]
        }
    ).encode()
    with pytest.raises(InvalidInput, match="runs past the end"):
        v2.parse_request(header + b"\x00", str(len(header)))
    with pytest.raises(InvalidInput, match="belong to no input"):
        v2.parse_request(header + b"\x00" * 8, str(len(header)))


def test_a_v2_answer_keeps_its_outputs_and_other_answers_become_one() -> None:
    document = {
        "id": "a",
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "data": [1, 2]}],
    }
    outputs, answer_id = v2.outputs_from_answer(json.dumps(document).encode(), "application/json")
    assert [(t.name, t.datatype, t.shape, t.data) for t in outputs] == [("y", "FP32", [2], [1, 2])]
    assert answer_id == "a"
    (plain,), _ = v2.outputs_from_answer(b"[[1, 2], [3, 4]]", "application/json")
    assert (plain.name, plain.datatype, plain.shape, plain.data) == (
        "output-0",
        "INT64",
        [2, 2],
        [1, 2, 3, 4],
    )
    (ragged,), _ = v2.outputs_from_answer(b'{"cat": 0.9}', "application/json")
    assert (ragged.datatype, ragged.data) == ("BYTES", ['{"cat": 0.9}'])
    (text,), _ = v2.outputs_from_answer(b"hello", "text/plain")
    assert (text.datatype, text.data) == ("BYTES", ["hello"])


def test_binary_outputs_when_asked_for() -> None:
    request = _request(
        {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]},
        outputs=[{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
    )
    outputs = [v2.Tensor("y", "INT32", [2], [7, 8]), v2.Tensor("z", "BYTES", [1], ["hi"])]
    body, header_length = v2.encode_response("m", "1.0", request, outputs, None)
    assert header_length is not None
    document = json.loads(body[:header_length])
    assert document["outputs"][0] == {
        "name": "y",
        "shape": [2],
        "datatype": "INT32",
        "parameters": {"binary_data_size": 8},
    }
    assert document["outputs"][1]["data"] == ["hi"]
    assert body[header_length:] == struct.pack("<2i", 7, 8)


def test_requested_outputs_must_exist() -> None:
    request = _request(
        {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}, outputs=[{"name": "nope"}]
    )
    with pytest.raises(InvalidInput, match="unknown output 'nope'"):
        v2.select_outputs([v2.Tensor("y", "FP32", [1], [1.0])], request.outputs)
