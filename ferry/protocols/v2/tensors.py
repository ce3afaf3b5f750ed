"""The Open Inference Protocol V2's vocabulary: its datatypes, the tensors and the infer
request that ``requests.py`` decodes and ``responses.py`` encodes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ferry.errors import InvalidInput
from ferry.protocols import tensor_bytes

BINARY_HEADER = "inference-header-content-length"
"""The binary tensor data extension's header: the length of the JSON part of a body."""

DATATYPES = (*tensor_bytes.FIXED_TYPES, "BYTES")
FREE_DIMENSION = -1
"""The one dimension of a BYTES input's shape its data may size (``"shape": [-1]``)."""


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


def object_parameters(value: Any, where: str) -> dict[str, Any]:
    """A ``parameters`` object as a dict (none: empty); ``InvalidInput`` for anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"'{where}' must be an object")
    return dict(value)


def flatten(data: Any) -> Iterator[Any]:
    """The scalars of nested lists, row-major."""
    if isinstance(data, list):
        for item in data:
            yield from flatten(item)
    else:
        yield data
