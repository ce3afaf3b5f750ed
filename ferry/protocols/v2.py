"""The Open Inference Protocol V2 (KServe V2, Triton's HTTP/REST protocol): tensors in JSON
and in the binary tensor data extension.

The rule Ferry applies (documented in docs/protocols.md): one V2 request is one request
to the handler, whatever its tensors' first dimension, so it batches with requests from
every other protocol. The handler receives the request as JSON (``{"id", "parameters",
"inputs": [{"name", "shape", "datatype", "parameters", "data"}]}``, binary inputs decoded
into ``data``), and TorchServe's
``kservev2`` envelope turns that into its rows for handlers written for TorchServe on
KServe. The handler's answer becomes the response's outputs: a V2 response document (what
the envelope produces) as it is, anything else as one output.

Shapes are whole numbers, except that a BYTES input may leave one dimension to its data
(``-1``, as TorchServe's KServe samples send ``"shape": [-1]``, which its ``kservev2``
envelope ignores for BYTES): the handler gets the size the elements give instead.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferry.errors import InvalidInput, RequestTooLarge
from ferry.protocols import tensor_bytes, untrusted_json

BINARY_HEADER = "inference-header-content-length"
"""The binary tensor data extension's header: the length of the JSON part of a body."""

DATATYPES = (*tensor_bytes.FIXED_TYPES, "BYTES")
FREE_DIMENSION = -1
"""The one dimension of a BYTES input's shape its data may size (``"shape": [-1]``)."""
_INT_RANGES = {
    "UINT8": (0, 2**8 - 1),
    "UINT16": (0, 2**16 - 1),
    "UINT32": (0, 2**32 - 1),
    "UINT64": (0, 2**64 - 1),
    "INT8": (-(2**7), 2**7 - 1),
    "INT16": (-(2**15), 2**15 - 1),
    "INT32": (-(2**31), 2**31 - 1),
    "INT64": (-(2**63), 2**63 - 1),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]
    """Row-major, flat: numbers, bools, or strings for BYTES (empty when ``raw``)."""
    parameters: dict[str, Any] = field(default_factory=dict)
    raw: bytes | memoryview | None = None
    """The elements as the client sent them in binary, checked but not unpacked."""

    def document(self, *, with_data: bool = True) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "shape": self.shape, "datatype": self.datatype}
        if with_data:
            entry["data"] = self.elements()
        if self.parameters:
            entry["parameters"] = self.parameters
        return entry

    def elements(self) -> list[Any]:
        """The flat elements, unpacked from ``raw`` if they came in binary."""
        if self.raw is None:
            return self.data
        return tensor_bytes.to_list(self.raw, self.datatype, self.name)


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    parameters: dict[str, Any]
    inputs: list[Tensor]
    outputs: list[RequestedOutput]
    binary_outputs: bool
    """``parameters.binary_data_output``: every output in binary unless it says otherwise."""

    def handler_document(self, *, binary_data: bool = True) -> dict[str, Any]:
        """What the handler receives (as JSON): binary inputs unpacked, or, without
        ``binary_data``, without their ``data``."""
        document: dict[str, Any] = {
            "inputs": [
                tensor.document(with_data=binary_data or tensor.raw is None)
                for tensor in self.inputs
            ]
        }
        if self.id is not None:
            document["id"] = self.id
        if self.parameters:
            document["parameters"] = self.parameters
        return document

    def worker_payload(self) -> tuple[bytes, str]:
        """The request for the worker, and its content type: binary inputs travel as
        the bytes they came in and are unpacked there (``ferry.protocols.tensor_bytes``)."""
        binary = {i: t.raw for i, t in enumerate(self.inputs) if t.raw is not None}
        return tensor_bytes.pack_request(self.handler_document(binary_data=False), binary)


# --- requests ----------------------------------------------------------------------------


def parse_request(
    body: bytes, header_length: str | None, max_elements: int | None = None
) -> InferRequest:
    """A V2 infer request: JSON, or JSON then binary tensor data when ``header_length``
    (the ``Inference-Header-Content-Length`` header) is given. Raises ``InvalidInput``,
    or ``RequestTooLarge`` when its inputs declare more than ``max_elements`` elements
    together (checked before any is decoded)."""
    json_part, binary = body, memoryview(body)[len(body) :]
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            message = f"{BINARY_HEADER} must be an integer, got {header_length!r}"
            raise InvalidInput(message) from None
        if not 0 <= length <= len(body):
            raise InvalidInput(f"{BINARY_HEADER} {length} exceeds the body's {len(body)} bytes")
        json_part, binary = body[:length], memoryview(body)[length:]
    try:
        document = untrusted_json.loads(json_part)
    except ValueError as exc:
        raise InvalidInput(f"the request is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidInput("the request must be a JSON object with 'inputs'")
    return _request(document, binary, ElementBudget(max_elements))


class ElementBudget:
    """What a request's tensors may hold together: each input's declared shape is
    charged before its elements are looked at, so an oversized request costs nothing to
    refuse."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.spent = 0

    def charge(self, shape: list[int], name: str) -> None:
        self.spent += math.prod(shape)
        if self.limit is not None and self.spent > self.limit:
            raise RequestTooLarge(
                f"input {name!r}: the request's tensors hold more than {self.limit} "
                "elements (max_tensor_elements)"
            )


def _request(document: dict[str, Any], binary: memoryview, budget: ElementBudget) -> InferRequest:
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    parameters = _parameters(document.get("parameters"), "parameters")
    chunks = _BinaryChunks(binary)
    tensors = [_input(entry, index, chunks, budget) for index, entry in enumerate(inputs)]
    chunks.finish()
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return InferRequest(
        request_id,
        parameters,
        tensors,
        _requested_outputs(document.get("outputs")),
        bool(parameters.get("binary_data_output", False)),
    )


class _BinaryChunks:
    """The binary part of a request, handed out to the inputs that declare a size."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.offset = 0

    def take(self, size: int, name: str) -> memoryview:
        if self.offset + size > len(self.data):
            raise InvalidInput(
                f"input {name!r}: binary_data_size {size} runs past the end of the body"
            )
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def finish(self) -> None:
        if self.offset != len(self.data):
            raise InvalidInput(
                f"{len(self.data) - self.offset} bytes of binary data belong to no input"
            )


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"'{where}' must be an object")
    return dict(value)


def _requested_outputs(value: Any) -> list[RequestedOutput]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput("'outputs' must be a list")
    requested = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidInput("each requested output must be an object with a 'name'")
        parameters = _parameters(entry.get("parameters"), f"outputs[{entry['name']}].parameters")
        requested.append(RequestedOutput(entry["name"], bool(parameters.get("binary_data"))))
    return requested


def _input(entry: Any, index: int, chunks: _BinaryChunks, budget: ElementBudget) -> Tensor:
    if not isinstance(entry, dict):
        raise InvalidInput(f"inputs[{index}] must be an object")
    name, datatype, shape = input_header(
        index, entry.get("name"), entry.get("datatype"), entry.get("shape")
    )
    sized_by_data = FREE_DIMENSION in shape
    if not sized_by_data:
        budget.charge(shape, name)  # before any element is looked at
    parameters = _parameters(entry.get("parameters"), f"input {name!r} parameters")
    size = parameters.pop("binary_data_size", None)
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"input {name!r}: binary_data_size must be a whole number")
        tensor = binary_input(name, datatype, shape, chunks.take(size, name), parameters)
    elif "data" not in entry:
        raise InvalidInput(f"input {name!r} has neither 'data' nor binary_data_size")
    else:
        tensor = decoded_input(name, datatype, shape, list(_flatten(entry["data"])), parameters)
    if sized_by_data:  # its size is known once its elements are counted
        budget.charge(tensor.shape, name)
    return tensor


def binary_input(
    name: str,
    datatype: str,
    shape: list[int],
    raw: bytes | memoryview,
    parameters: dict[str, Any] | None = None,
) -> Tensor:
    """An input whose elements came as little-endian bytes (REST's binary extension,
    gRPC's ``raw_input_contents``), after ``input_header``: checked to hold the elements
    its shape declares (a BYTES input's -1 takes the size its elements give), and kept as
    bytes."""
    count = tensor_bytes.element_count(raw, datatype, name)
    shape = _sized(shape, count, name)
    expected = math.prod(shape)
    if count != expected:
        raise InvalidInput(
            f"input {name!r}: shape {shape} holds {expected} elements, the data has {count}"
        )
    return Tensor(name, datatype, shape, [], dict(parameters or {}), raw=raw)


def input_header(index: int, name: Any, datatype: Any, shape: Any) -> tuple[str, str, list[int]]:
    """The name, datatype and shape of ``inputs[index]``, checked (``InvalidInput``, with
    the same words for every transport). A BYTES input's shape may hold one -1
    (``FREE_DIMENSION``), as TorchServe's KServe samples send ``"shape": [-1]``: its size
    is what the elements give, set by ``decoded_input`` / ``binary_input``."""
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"inputs[{index}] needs a 'name'")
    if datatype not in DATATYPES:
        raise InvalidInput(
            f"input {name!r}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}"
        )
    return name, datatype, _shape(shape, name, datatype)


def decoded_input(
    name: str,
    datatype: str,
    shape: list[int],
    data: list[Any],
    parameters: dict[str, Any] | None = None,
) -> Tensor:
    """An input whose elements a transport decoded itself (gRPC's typed or raw contents;
    BYTES elements as base64 text, as ``decode_binary`` gives them), after
    ``input_header``: its elements checked against its shape and datatype as a JSON
    input's are (a BYTES input's -1 takes the size its elements give)."""
    shape = _sized(shape, len(data), name)
    _check_elements(data, datatype, shape, name)
    return Tensor(name, datatype, shape, data, dict(parameters or {}))


def infer_request(
    request_id: str | None,
    parameters: dict[str, Any],
    inputs: list[Tensor],
    outputs: list[str],
    max_elements: int | None = None,
) -> InferRequest:
    """A request from decoded inputs (``decoded_input``, ``binary_input``) and the names
    of the outputs asked for (none: all); no output in binary, a JSON notion.
    ``RequestTooLarge`` beyond ``max_elements`` elements in all."""
    if not inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    budget = ElementBudget(max_elements)
    for tensor in inputs:
        budget.charge(tensor.shape, tensor.name)
    requested = [RequestedOutput(name, binary=False) for name in outputs]
    return InferRequest(request_id, dict(parameters), inputs, requested, binary_outputs=False)


def _shape(value: Any, name: str, datatype: str) -> list[int]:
    whole = "'shape' must be a list of whole numbers"
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= FREE_DIMENSION for d in value
    ):
        raise InvalidInput(f"input {name!r}: {whole}")
    free = value.count(FREE_DIMENSION)
    if free and datatype != "BYTES":
        raise InvalidInput(
            f"input {name!r}: {whole} (-1, a size the data gives, is for BYTES inputs only)"
        )
    if free > 1:
        raise InvalidInput(f"input {name!r}: 'shape' may hold one -1, not {free}")
    return list(value)


def _sized(shape: list[int], count: int, name: str) -> list[int]:
    """``shape`` with its -1, if any, set to the size that ``count`` elements give it (as
    numpy's ``reshape`` infers it); ``InvalidInput`` when they fill no such shape."""
    if FREE_DIMENSION not in shape:
        return shape
    known = math.prod(d for d in shape if d != FREE_DIMENSION)
    if known == 0 or count % known:
        raise InvalidInput(
            f"input {name!r}: no size for the -1 of shape {shape} fits the data's "
            f"element count, {count}"
        )
    return [count // known if d == FREE_DIMENSION else d for d in shape]


def _flatten(data: Any) -> Iterator[Any]:
    if isinstance(data, list):
        for item in data:
            yield from _flatten(item)
    else:
        yield data


def _check_elements(data: list[Any], datatype: str, shape: list[int], name: str) -> None:
    expected = math.prod(shape)
    if len(data) != expected:
        raise InvalidInput(
            f"input {name!r}: shape {shape} holds {expected} elements, the data has {len(data)}"
        )
    valid = _validator(datatype)
    for value in data:
        if not valid(value):
            raise InvalidInput(f"input {name!r}: {value!r} is not a valid {datatype} element")


def _validator(datatype: str) -> Any:
    if datatype == "BOOL":
        return lambda v: isinstance(v, bool)
    if datatype == "BYTES":
        return lambda v: isinstance(v, str)
    if datatype in _INT_RANGES:
        low, high = _INT_RANGES[datatype]
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
    return lambda v: isinstance(v, int | float) and not isinstance(v, bool)


def encode_binary(tensor: Tensor) -> bytes:
    if tensor.raw is not None:
        return bytes(tensor.raw)
    return tensor_bytes.encode(tensor.data, tensor.datatype)


# --- responses ---------------------------------------------------------------------------


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
    data = list(_flatten(entry.get("data", [])))
    datatype = entry.get("datatype") or _datatype_of(data)
    shape = entry.get("shape")
    if not isinstance(shape, list):
        shape = [len(data)]
    return Tensor(
        str(entry.get("name", f"output-{index}")),
        str(datatype),
        [int(d) for d in shape],
        data,
        _parameters(entry.get("parameters"), "output parameters"),
    )


def tensor_from_value(name: str, value: Any) -> Tensor:
    """A JSON value as a tensor: nested lists give the shape, their elements the datatype;
    anything that is not a rectangular array of scalars (a dict, a ragged list) is one
    BYTES element holding its JSON text."""
    shape = _rectangular_shape(value)
    data = list(_flatten(value)) if shape is not None else []
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
