"""The Open Inference Protocol's gRPC conversions (``ferry.grpc.open_inference_codec``),
over plain values: this process never loads Ferry's ``inference.*`` descriptors, which
would collide with tritonclient.grpc's in the integration tests; the generated module is
checked in a subprocess."""

from __future__ import annotations

import base64
import json
import math
import struct
import subprocess
import sys
from typing import Any

import pytest

from ferry.errors import InvalidInput
from ferry.grpc import open_inference_codec as codec
from ferry.grpc.open_inference_codec import InputTensor
from ferry.protocols import v2


def _typed(name: str, datatype: str, shape: list[int], **contents: list[Any]) -> InputTensor:
    return InputTensor(name, datatype, shape, {}, contents)


def _request(*inputs: InputTensor, raw: list[bytes] | None = None) -> v2.InferRequest:
    return codec.infer_request("", {}, list(inputs), raw or [], [])


def test_typed_contents_become_the_document_rest_sends_the_handler() -> None:
    request = codec.infer_request(
        "req-1",
        {"priority": 3},
        [
            _typed("x", "FP32", [1, 2], fp32_contents=[1.5, -2.0]),
            _typed("n", "INT8", [2], int_contents=[-3, 4]),
            _typed("u", "UINT64", [1], uint64_contents=[2**64 - 1]),
            _typed("b", "BOOL", [2], bool_contents=[True, False]),
            _typed("w", "BYTES", [2], bytes_contents=[b"abc", b"\x00\xff"]),
            _typed("e", "FP64", [0]),
        ],
        [],
        ["x_out"],
    )
    assert request.handler_document() == {
        "id": "req-1",
        "parameters": {"priority": 3},
        "inputs": [
            {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.5, -2.0]},
            {"name": "n", "shape": [2], "datatype": "INT8", "data": [-3, 4]},
            {"name": "u", "shape": [1], "datatype": "UINT64", "data": [2**64 - 1]},
            {"name": "b", "shape": [2], "datatype": "BOOL", "data": [True, False]},
            {"name": "w", "shape": [2], "datatype": "BYTES", "data": ["YWJj", "AP8="]},
            {"name": "e", "shape": [0], "datatype": "FP64", "data": []},
        ],
    }
    assert [(r.name, r.binary) for r in request.outputs] == [("x_out", False)]


def test_raw_contents_decode_as_rests_binary_tensors() -> None:
    words = b"".join(struct.pack("<I", len(w)) + w for w in (b"hi", b"\x00\xffraw"))
    request = _request(
        _typed("x", "FP32", [2, 2]),
        _typed("w", "BYTES", [2]),
        _typed("h", "FP16", [1]),
        raw=[struct.pack("<4f", 1, 2, 3, 4.5), words, struct.pack("<e", 0.5)],
    )
    data = [tensor.elements() for tensor in request.inputs]
    assert data == [[1.0, 2.0, 3.0, 4.5], ["aGk=", "AP9yYXc="], [0.5]]
    assert all(tensor.data == [] and tensor.raw is not None for tensor in request.inputs)
    assert request.id is None and "id" not in request.handler_document()


def test_a_bytes_input_shaped_minus_one_is_sized_by_its_contents() -> None:
    """TorchServe's KServe gRPC sample (``mnist_v2_bytes_grpc.json``): one image in
    ``bytes_contents``, shape [-1]; typed or raw, the handler gets the size."""
    image = b"\x89PNG\r\n\x1a\n-not-really-a-png"
    typed = _request(_typed("img", "BYTES", [-1], bytes_contents=[image]))
    assert typed.handler_document()["inputs"] == [
        {
            "name": "img",
            "shape": [1],
            "datatype": "BYTES",
            "data": [base64.b64encode(image).decode()],
        }
    ]
    raw = struct.pack("<I", len(image)) + image + struct.pack("<I", 1) + b"x"
    (tensor,) = _request(_typed("img", "BYTES", [-1]), raw=[raw]).inputs
    assert tensor.shape == [2] and tensor.elements() == [base64.b64encode(image).decode(), "eA=="]


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (_typed("x", "FP32", [2, 2], fp32_contents=[1.0, 2.0]), "holds 4 elements, the data has 2"),
        (_typed("x", "FP32", [-1], fp32_contents=[1.0]), "-1.*is for BYTES inputs only"),
        (_typed("w", "BYTES", [3, -1], bytes_contents=[b"a"]), "element count, 1"),
        (_typed("x", "FP42", [1], fp32_contents=[1.0]), "datatype 'FP42' is not one of"),
        (_typed("x", "INT8", [1], int_contents=[300]), "300 is not a valid INT8 element"),
        (_typed("x", "FP32", [-1]), "'shape' must be a list of whole numbers"),
        (_typed("", "FP32", [0]), r"inputs\[0\] needs a 'name'"),
        (_typed("x", "FP16", [1], fp32_contents=[1.0]), "FP16 has no typed contents"),
        (
            _typed("x", "FP32", [1], fp64_contents=[1.0]),
            "FP32 elements go in contents.fp32_contents, not contents.fp64_contents",
        ),
    ],
)
def test_typed_inputs_are_checked_with_rests_words(tensor: InputTensor, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        _request(tensor)


def test_raw_contents_are_checked() -> None:
    with pytest.raises(InvalidInput, match="raw_input_contents holds 1 tensors for 2 inputs"):
        _request(_typed("x", "FP32", [1]), _typed("y", "FP32", [1]), raw=[b"\0" * 4])
    with pytest.raises(InvalidInput, match="both contents and raw_input_contents"):
        _request(_typed("x", "FP32", [1], fp32_contents=[1.0]), raw=[b"\0" * 4])
    with pytest.raises(InvalidInput, match="is not a whole number of FP32"):
        _request(_typed("x", "FP32", [1]), raw=[b"\0" * 3])
    with pytest.raises(InvalidInput, match="holds 2 elements, the data has 1"):
        _request(_typed("x", "FP32", [2]), raw=[b"\0" * 4])
    with pytest.raises(InvalidInput, match="'inputs' must be a non-empty list"):
        _request()


def test_outputs_go_raw_with_their_parameters() -> None:
    outputs = [
        v2.Tensor("y", "FP32", [2], [1.0, 2.5], {"scale": 0.5, "tag": "a", "big": 2**63}),
        v2.Tensor("w", "BYTES", [1], ["héllo"]),
    ]
    y, w = codec.output_tensors(outputs)
    assert (y.name, y.datatype, y.shape, y.raw) == ("y", "FP32", [2], struct.pack("<2f", 1, 2.5))
    assert y.parameters == {
        "scale": ("double_param", 0.5),
        "tag": ("string_param", "a"),
        "big": ("uint64_param", 2**63),
    }
    assert w.raw == struct.pack("<I", 6) + "héllo".encode()


def test_an_output_not_of_its_datatype_is_a_bad_answer() -> None:
    with pytest.raises(InvalidInput, match="output 'y' cannot be sent as INT64"):
        codec.output_tensors([v2.Tensor("y", "INT64", [1], [1.5])])
    with pytest.raises(InvalidInput, match="output 'y' cannot be sent as FLOAT"):
        codec.output_tensors([v2.Tensor("y", "FLOAT", [1], [1.5])])


def test_parameters_pick_their_kind() -> None:
    assert codec.parameter(False) == ("bool_param", False)
    assert codec.parameter(-(2**63)) == ("int64_param", -(2**63))
    assert codec.parameter(2**64) == ("string_param", str(2**64))
    assert codec.parameter(math.inf) == ("double_param", math.inf)
    assert codec.parameter({"a": None}) == ("string_param", json.dumps({"a": None}))


def test_the_response_id_is_the_requests_else_the_answers() -> None:
    with_id = codec.infer_request("r", {}, [_typed("x", "FP32", [0])], [], [])
    without = _request(_typed("x", "FP32", [0]))
    assert codec.response_id(with_id, "from-handler") == "r"
    assert codec.response_id(without, "from-handler") == "from-handler"
    assert codec.response_id(without, None) == ""


def test_load_registers_the_stores_archive_synchronously() -> None:
    request = codec.load_request("tensors")
    assert (request.url, request.model_name, request.synchronous) == (
        "tensors.mar",
        "tensors",
        True,
    )


def test_bytes_contents_reach_the_handler_as_rests_binary_bytes_do() -> None:
    typed = _request(_typed("w", "BYTES", [1], bytes_contents=[b"\x01\x02"]))
    raw = _request(_typed("w", "BYTES", [1]), raw=[struct.pack("<I", 2) + b"\x01\x02"])
    expected = [base64.b64encode(b"\x01\x02").decode()]
    assert typed.inputs[0].data == raw.inputs[0].elements() == expected


_DESCRIBE = """
import json, sys
from ferry.grpc import open_inference_codec, open_inference
from ferry.grpc.generated import ferry_open_inference_pb2 as pb
service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
def fields(message):
    return {f.name: f.number for f in message.DESCRIPTOR.fields}
json.dump({
    "service": service.full_name,
    "methods": sorted(m.name for m in service.methods),
    "infer": fields(pb.ModelInferRequest),
    "input": fields(pb.ModelInferRequest.InferInputTensor),
    "response": fields(pb.ModelInferResponse),
    "contents": fields(pb.InferTensorContents),
    "parameter": fields(pb.InferParameter),
    "load": fields(pb.RepositoryModelLoadRequest),
    "unload": fields(pb.RepositoryModelUnloadRequest),
}, sys.stdout)
"""


def test_the_generated_service_has_the_protocols_names_and_numbers() -> None:
    """In a subprocess: Ferry's ``inference.*`` must not enter this process's pool."""
    result = subprocess.run(
        [sys.executable, "-c", _DESCRIBE], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    assert described["service"] == "inference.GRPCInferenceService"
    assert described["methods"] == sorted(
        [
            "ServerLive",
            "ServerReady",
            "ModelReady",
            "ServerMetadata",
            "ModelMetadata",
            "ModelInfer",
            "RepositoryModelLoad",
            "RepositoryModelUnload",
        ]
    )
    assert described["infer"] == {
        "model_name": 1,
        "model_version": 2,
        "id": 3,
        "parameters": 4,
        "inputs": 5,
        "outputs": 6,
        "raw_input_contents": 7,
    }
    assert described["input"] == {
        "name": 1,
        "datatype": 2,
        "shape": 3,
        "parameters": 4,
        "contents": 5,
    }
    assert described["response"]["raw_output_contents"] == 6
    assert described["contents"]["bytes_contents"] == 8
    assert described["parameter"] == {
        "bool_param": 1,
        "int64_param": 2,
        "string_param": 3,
        "double_param": 4,
        "uint64_param": 5,
    }
    triton_numbering = {"repository_name": 1, "model_name": 2, "parameters": 3}
    assert described["load"] == described["unload"] == triton_numbering


def test_the_codec_loads_no_inference_descriptors() -> None:
    """The codec (and so this test module) stays usable beside tritonclient.grpc."""
    probe = (
        "import sys, ferry.grpc.open_inference_codec\n"
        "assert not [m for m in sys.modules if m.startswith('ferry.grpc.generated')]\n"
        "assert 'google.protobuf' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
