"""Encoding V2 responses: a handler's answer as output tensors, those the request asked
for, and the response body (JSON, with binary outputs after it when asked for)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from ferry.errors import InvalidInput
from ferry.protocols import tensor_bytes, untrusted_json
from ferry.protocols.v2.tensors import (
    InferRequest,
    RequestedOutput,
    Tensor,
    flatten,
    object_parameters,
)


def encode_binary(tensor: Tensor) -> bytes:
    if tensor.raw is not None:
        return bytes(tensor.raw)
    return tensor_bytes.encode(tensor.data, tensor.datatype)


def outputs_from_answer(body: bytes, content_type: str) -> tuple[list[Tensor], str | None]:
    """The response tensors for a handler's answer, and the ``id`` it gave, if any.

    A V2 response document (``{"outputs": [...]}``, e.g. from the ``kservev2`` envelope)
    gives its outputs; any other JSON value is one output ``output-0`` whose shape and
    datatype follow the value; non-JSON bytes are one BYTES element."""
    if content_type.startswith("application/json"):
        try:
            value = untrusted_json.loads(body)
        except ValueError:
            value = None
        else:
            if isinstance(value, dict) and isinstance(value.get("outputs"), list):
                outputs = [_output(entry, i) for i, entry in enumerate(value["outputs"])]
                answer_id = value.get("id")
                return outputs, answer_id if isinstance(answer_id, str) else None
            return [tensor_from_value("output-0", value)], None
    text = body.decode("utf-8", errors="replace") if _is_utf8(body) else _b64(body)
    return [Tensor("output-0", "BYTES", [1], [text])], None


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _b64(body: bytes) -> str:
    return base64.b64encode(body).decode()


def _output(entry: Any, index: int) -> Tensor:
    if not isinstance(entry, dict):
        raise ValueError(f"outputs[{index}] is not an object")
    data = list(flatten(entry.get("data", [])))
    datatype = entry.get("datatype") or _datatype_of(data)
    shape = entry.get("shape")
    if not isinstance(shape, list):
        shape = [len(data)]
    return Tensor(
        str(entry.get("name", f"output-{index}")),
        str(datatype),
        [int(d) for d in shape],
        data,
        object_parameters(entry.get("parameters"), "output parameters"),
    )


def tensor_from_value(name: str, value: Any) -> Tensor:
    """A JSON value as a tensor: nested lists give the shape, their elements the datatype;
    anything that is not a rectangular array of scalars (a dict, a ragged list) is one
    BYTES element holding its JSON text."""
    shape = _rectangular_shape(value)
    data = list(flatten(value)) if shape is not None else []
    if shape is None or any(isinstance(v, dict | list) or v is None for v in data):
        return Tensor(name, "BYTES", [1], [json.dumps(value)])
    return Tensor(name, _datatype_of(data), shape, data)


def _rectangular_shape(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return []
    if not value:
        return [0]
    shapes = [_rectangular_shape(item) for item in value]
    if any(shape is None or shape != shapes[0] for shape in shapes):
        return None
    first = shapes[0]
    assert first is not None
    return [len(value), *first]


def _datatype_of(data: Sequence[Any]) -> str:
    if data and all(isinstance(v, bool) for v in data):
        return "BOOL"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in data):
        return "INT64"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in data):
        return "FP64"  # JSON numbers, as TorchServe's kservev2 envelope types Python floats
    return "BYTES"


def select_outputs(outputs: list[Tensor], requested: list[RequestedOutput]) -> list[Tensor]:
    """Only the requested outputs, in the order requested; all when none are named."""
    if not requested:
        return outputs
    by_name = {tensor.name: tensor for tensor in outputs}
    missing = [r.name for r in requested if r.name not in by_name]
    if missing:
        raise InvalidInput(
            f"unknown output {missing[0]!r}; the model answers {', '.join(by_name) or 'nothing'}"
        )
    return [by_name[r.name] for r in requested]


def encode_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    outputs: list[Tensor],
    answer_id: str | None,
) -> tuple[bytes, int | None]:
    """The response body, and the JSON part's length when binary outputs follow it."""
    binary_names = _binary_output_names(request, outputs)
    entries, blobs = [], []
    for tensor in outputs:
        if tensor.name in binary_names:
            blob = encode_binary(tensor)
            blobs.append(blob)
            entries.append(_binary_output_entry(tensor, len(blob)))
        else:
            entries.append(tensor.document())
    document: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    identifier = request.id if request.id is not None else answer_id
    if identifier is not None:
        document["id"] = identifier
    document["outputs"] = entries
    header = json.dumps(document).encode()
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def _binary_output_names(request: InferRequest, outputs: list[Tensor]) -> set[str]:
    """The outputs sent as binary data: those requested with ``binary_data``, and with
    ``binary_data_output`` every output the request does not name."""
    binary_names = {r.name for r in request.outputs if r.binary}
    if request.binary_outputs:
        flagged = {r.name for r in request.outputs}
        binary_names |= {t.name for t in outputs if t.name not in flagged}
    return binary_names


def _binary_output_entry(tensor: Tensor, size: int) -> dict[str, Any]:
    """``tensor``'s entry in ``outputs`` when its data follows the JSON as ``size`` bytes."""
    parameters = {**tensor.parameters, "binary_data_size": size}
    return {
        "name": tensor.name,
        "shape": tensor.shape,
        "datatype": tensor.datatype,
        "parameters": parameters,
    }


def error_document(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
