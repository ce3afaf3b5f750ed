"""gRPC targets for ``ferry bench load``: TorchServe's ``Predictions`` and the Open
Inference Protocol's ``ModelInfer``, over one ``grpc.aio`` channel with Ferry's stubs.

Payloads become requests once, before the load starts:

- ``Predictions``: ``input={"data": payload}``, as TorchServe's own gRPC client sends a file.
- ``ModelInfer``: a payload that is a V2 JSON request (``{"inputs": [...]}``, the document
  ``bench load`` posts to ``/v2/models/M/infer``) becomes the same tensors, every input's
  elements in ``raw_input_contents`` (any datatype, FP16 and BF16 included; BYTES elements
  as their UTF-8 bytes) and its ``outputs`` as requested outputs; any other payload (an
  image, say) is one BYTES input ``input-0`` of shape [1] holding it, which the
  ``kservev2`` envelope hands a handler as base64 text.

This module loads the ``inference.*`` descriptors (``ferry.grpc.open_inference``'s note):
it runs in the ``ferry bench`` process, never beside tritonclient's or kserve's stubs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import grpc
from grpc import aio

from ferry.errors import InvalidInput
from ferry.grpc.generated import ferry_open_inference_pb2 as oip
from ferry.grpc.generated import ferry_open_inference_pb2_grpc as oip_grpc
from ferry.grpc.generated import ferry_torchserve_inference_pb2 as ts_pb
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as ts_grpc
from ferry.grpc.open_inference_codec import parameter
from ferry.protocols import v2
from ferry_bench.target_types import (
    REQUEST_TIMEOUT_S,
    Answer,
    GrpcCall,
    NoAnswer,
    TargetSpec,
    UnsupportedTarget,
)

GRPC_TO_HTTP: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.OUT_OF_RANGE: 416,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""The HTTP status a gRPC code stands for (the inverse of ``ferry.grpc.errors``'
``HTTP_TO_GRPC``, TorchServe's table); any other code counts as 500."""

_NO_CONNECTION = ("failed to connect", "connection refused", "connection reset")


def grpc_target(spec: TargetSpec, call: GrpcCall) -> TorchServeTarget | OpenInferenceTarget:
    if call.service == "torchserve":
        return TorchServeTarget(spec, call.address, call.model, call.version)
    return OpenInferenceTarget(spec, call.address, call.model, call.version)


class _GrpcTarget:
    def __init__(self, spec: TargetSpec, address: str) -> None:
        self.channel = aio.insecure_channel(address)
        self._metadata = (("authorization", f"Bearer {spec.token}"),) if spec.token else None

    async def _call(self, method: Any, request: Any) -> tuple[grpc.StatusCode, Any]:
        try:
            response = await method(request, timeout=REQUEST_TIMEOUT_S, metadata=self._metadata)
        except aio.AioRpcError as exc:
            details = (exc.details() or "").lower()
            if exc.code() == grpc.StatusCode.UNAVAILABLE and any(
                words in details for words in _NO_CONNECTION
            ):
                raise NoAnswer("GrpcUnavailable", exc.details() or "") from exc
            return exc.code(), (exc.details() or "").encode()
        return grpc.StatusCode.OK, response

    @staticmethod
    def _answer(code: grpc.StatusCode, body: bytes) -> Answer:
        return Answer(GRPC_TO_HTTP.get(code, 500), body, code.name)

    async def close(self) -> None:
        await self.channel.close()


class TorchServeTarget(_GrpcTarget):
    protocol = "grpc-torchserve"

    def __init__(self, spec: TargetSpec, address: str, model: str, version: str) -> None:
        super().__init__(spec, address)
        self._stub = ts_grpc.InferenceAPIsServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self._requests = [
            ts_pb.PredictionsRequest(model_name=model, model_version=version, input={"data": p})
            for p in spec.payloads
        ]

    async def send(self, index: int) -> Answer:
        request = self._requests[index % len(self._requests)]
        code, response = await self._call(self._stub.Predictions, request)
        body = response.prediction if code == grpc.StatusCode.OK else response
        return self._answer(code, body)


class OpenInferenceTarget(_GrpcTarget):
    protocol = "grpc-v2"

    def __init__(self, spec: TargetSpec, address: str, model: str, version: str) -> None:
        super().__init__(spec, address)
        self._stub = oip_grpc.GRPCInferenceServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self._requests = [infer_request(model, version, p) for p in spec.payloads]

    async def send(self, index: int) -> Answer:
        request = self._requests[index % len(self._requests)]
        code, response = await self._call(self._stub.ModelInfer, request)
        body = response.SerializeToString() if code == grpc.StatusCode.OK else response
        return self._answer(code, body)


def infer_request(model: str, version: str, payload: bytes) -> oip.ModelInferRequest:
    """The ``ModelInferRequest`` for a payload (the module's note says how)."""
    request = oip.ModelInferRequest(model_name=model, model_version=version)
    document = _v2_document(payload)
    if document is None:
        raw_input = request.inputs.add(name="input-0", datatype="BYTES", shape=[1])
        raw_input.contents.bytes_contents.append(payload)
        return request
    try:
        parsed = v2.parse_request(payload, None)
        raw = [v2.encode_binary(tensor) for tensor in parsed.inputs]
    except (InvalidInput, ValueError, TypeError, KeyError) as exc:
        raise UnsupportedTarget(f"the V2 request cannot be sent over gRPC: {exc}") from exc
    if parsed.id is not None:
        request.id = parsed.id
    _set_parameters(request.parameters, parsed.parameters)
    for decoded in parsed.inputs:
        entry = request.inputs.add(
            name=decoded.name, datatype=decoded.datatype, shape=decoded.shape
        )
        _set_parameters(entry.parameters, decoded.parameters)
    request.raw_input_contents.extend(raw)
    for output in parsed.outputs:
        request.outputs.add(name=output.name)
    return request


def _v2_document(payload: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    return document if isinstance(document, dict) and "inputs" in document else None


def _set_parameters(entries: Any, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        kind, converted = parameter(value)
        setattr(entries[key], kind, converted)
