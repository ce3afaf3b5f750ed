"""The Open Inference Protocol's gRPC tensors as ``ferry.protocols.v2`` values, and back,
over plain Python values: no protobuf here, so it can be used (and tested) in a process
that holds tritonclient's or kserve's ``inference.*`` stubs.

Inputs come in their datatype's typed ``contents`` field (``CONTENTS``) or, for every
input at once, in ``raw_input_contents`` (little-endian, row-major, as the REST binary
extension's: ``v2.binary_input``, kept as bytes until the worker unpacks them). They are
checked as REST's inputs are, with the same words, and BYTES elements become base64 text,
as binary BYTES over REST do.

Outputs always go back in ``raw_output_contents``, as Triton answers: tritonclient's
``InferResult.as_numpy`` reads only that (typed contents only for BYTES), and KServe's
client reads it too when present.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ferry.errors import InvalidInput
from ferry.protocols import v2
from ferry.service.types import RegisterRequest

CONTENTS: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""Each datatype's ``InferTensorContents`` field; FP16 and BF16 have none (raw only)."""

_INT64 = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1

Parameter = tuple[str, Any]
"""An ``InferParameter``: the ``parameter_choice`` field that is set, and its value."""


@dataclass(frozen=True)
class InputTensor:
    """A request's ``InferInputTensor``."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any]
    contents: dict[str, list[Any]]
    """The ``contents`` fields that hold elements, by field name (empty for raw inputs)."""


@dataclass(frozen=True)
class OutputTensor:
    """A response's ``InferOutputTensor`` with its ``raw_output_contents`` entry."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Parameter]
    raw: bytes


def infer_request(
    request_id: str,
    parameters: dict[str, Any],
    inputs: Sequence[InputTensor],
    raw: Sequence[bytes],
    outputs: Sequence[str],
    max_elements: int | None = None,
) -> v2.InferRequest:
    """A ``ModelInferRequest`` as the V2 request REST would have made of it; raises
    ``InvalidInput``, or ``RequestTooLarge`` beyond ``max_elements`` elements in all. An
    empty ``request_id`` is no id, as proto3 cannot tell them apart.

    >>> x = InputTensor("x", "FP32", [2], {}, {"fp32_contents": [1.0, 2.5]})
    >>> infer_request("r1", {}, [x], [], []).handler_document()["inputs"][0]["data"]
    [1.0, 2.5]
    """
    if raw and len(raw) != len(inputs):
        raise InvalidInput(
            f"raw_input_contents holds {len(raw)} tensors for {len(inputs)} inputs; "
            "send every input's elements there, in the order of inputs"
        )
    tensors = [
        _input(index, tensor, raw[index] if raw else None) for index, tensor in enumerate(inputs)
    ]
    return v2.infer_request(request_id or None, parameters, tensors, list(outputs), max_elements)


def _input(index: int, tensor: InputTensor, raw: bytes | None) -> v2.Tensor:
    name, datatype, shape = v2.input_header(index, tensor.name, tensor.datatype, tensor.shape)
    if raw is None:
        data = _typed_elements(name, datatype, tensor.contents)
        return v2.decoded_input(name, datatype, shape, data, tensor.parameters)
    if tensor.contents:
        raise InvalidInput(
            f"input {name!r}: its elements are in both contents and raw_input_contents"
        )
    return v2.binary_input(name, datatype, shape, raw, tensor.parameters)


def _typed_elements(name: str, datatype: str, contents: dict[str, list[Any]]) -> list[Any]:
    field = CONTENTS.get(datatype)
    if field is None:
        raise InvalidInput(
            f"input {name!r}: {datatype} has no typed contents; send it in raw_input_contents"
        )
    others = sorted(set(contents) - {field})
    if others:
        raise InvalidInput(
            f"input {name!r}: {datatype} elements go in contents.{field}, not contents.{others[0]}"
        )
    values = contents.get(field, [])
    if datatype == "BYTES":  # JSON cannot carry raw bytes: base64, as REST's binary BYTES
        return [base64.b64encode(bytes(value)).decode() for value in values]
    return list(values)


def output_tensors(outputs: Sequence[v2.Tensor]) -> list[OutputTensor]:
    """The outputs with their raw bytes; ``InvalidInput`` (as REST's answer for a handler
    answer that is no V2 response) when an output's elements are not of its datatype."""
    return [
        OutputTensor(
            tensor.name,
            tensor.datatype,
            tensor.shape,
            {key: parameter(value) for key, value in tensor.parameters.items()},
            _raw(tensor),
        )
        for tensor in outputs
    ]


def _raw(tensor: v2.Tensor) -> bytes:
    try:
        return v2.encode_binary(tensor)
    except (KeyError, struct.error, TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(
            f"the handler's answer is not a V2 response: output {tensor.name!r} "
            f"cannot be sent as {tensor.datatype}: {exc}"
        ) from exc


def parameter(value: Any) -> Parameter:
    """A parameter's value as an ``InferParameter`` choice: a whole number beyond int64
    as ``uint64_param``; a value of no parameter kind (a list, an object) as its JSON.

    >>> parameter(True), parameter(3), parameter(0.5), parameter([1])
    (('bool_param', True), ('int64_param', 3), ('double_param', 0.5), ('string_param', '[1]'))
    """
    if isinstance(value, bool):
        return "bool_param", value
    if isinstance(value, int):
        if _INT64[0] <= value <= _INT64[1]:
            return "int64_param", value
        if 0 <= value <= _UINT64_MAX:
            return "uint64_param", value
        return "string_param", str(value)
    if isinstance(value, float):
        return "double_param", value
    if isinstance(value, str):
        return "string_param", value
    return "string_param", json.dumps(value)


def load_request(name: str) -> RegisterRequest:
    """``RepositoryModelLoad``: the model store's ``NAME.mar`` as ``NAME``, synchronously
    (the call answers once the model loaded or failed to)."""
    return RegisterRequest(url=f"{name}.mar", model_name=name, synchronous=True)


def response_id(request: v2.InferRequest, answer_id: str | None) -> str:
    """The request's id, else the one the handler's answer gave (REST's rule); "" if none."""
    if request.id is not None:
        return request.id
    return answer_id or ""


__all__ = [
    "CONTENTS",
    "InputTensor",
    "OutputTensor",
    "Parameter",
    "infer_request",
    "load_request",
    "output_tensors",
    "parameter",
    "response_id",
]
