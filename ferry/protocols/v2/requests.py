"""Decoding V2 infer requests: REST's JSON body (with the binary tensor data extension's
bytes after it) and the inputs gRPC decodes itself, checked against their shapes and
datatypes, and charged against the request's element budget before any is decoded."""

from __future__ import annotations

import math
from typing import Any

from ferry.errors import InvalidInput, RequestTooLarge
from ferry.protocols import tensor_bytes, untrusted_json
from ferry.protocols.v2.tensors import (
    BINARY_HEADER,
    DATATYPES,
    FREE_DIMENSION,
    InferRequest,
    RequestedOutput,
    Tensor,
    flatten,
    object_parameters,
)

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
    parameters = object_parameters(document.get("parameters"), "parameters")
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


def _requested_outputs(value: Any) -> list[RequestedOutput]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput("'outputs' must be a list")
    requested = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidInput("each requested output must be an object with a 'name'")
        parameters = object_parameters(
            entry.get("parameters"), f"outputs[{entry['name']}].parameters"
        )
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
    parameters = object_parameters(entry.get("parameters"), f"input {name!r} parameters")
    size = parameters.pop("binary_data_size", None)
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"input {name!r}: binary_data_size must be a whole number")
        tensor = binary_input(name, datatype, shape, chunks.take(size, name), parameters)
    elif "data" not in entry:
        raise InvalidInput(f"input {name!r} has neither 'data' nor binary_data_size")
    else:
        tensor = decoded_input(name, datatype, shape, list(flatten(entry["data"])), parameters)
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
