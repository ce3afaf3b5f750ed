"""The Open Inference Protocol (KServe V2) over gRPC: ``inference.GRPCInferenceService`` on
the gRPC inference server, beside TorchServe's ``InferenceAPIsService`` (the same port,
auth and TLS), with the REST adapter's semantics (``ferry.http.kserve``).

``ModelInfer`` is one ``service.predict`` call with the JSON document REST would send the
handler (``v2.InferRequest.handler_document``), read through the ``kservev2`` envelope
where REST's is, so it queues and batches with every other protocol's requests; the
answer's outputs (``v2.outputs_from_answer``), less those not asked for, go back in
``raw_output_contents`` (``open_inference_codec`` says why).
``RepositoryModelLoad`` registers the model store's ``NAME.mar`` synchronously, with one
worker unless its model-config asks for more. Load and unload are management operations,
as registering over REST is: they need the management key whenever keys are on, even on
loopback (``REPOSITORY_METHODS``, checked by ``ferry.grpc.auth``), and the model API
(``--enable-model-api``), else PERMISSION_DENIED with REST's words, as TorchServe's gRPC
``RegisterModel`` answers. Errors take the gRPC codes of ``ferry.error_table``, as they are.

This module loads the ``inference.*`` descriptors into protobuf's default pool: a process
that imports it cannot import tritonclient.grpc or kserve's stubs too. The conversions
live in ``open_inference_codec``, which imports no protobuf.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Never

from grpc import aio

from ferry import __version__
from ferry.apis import Apis
from ferry.echo import capped_message
from ferry.errors import FerryError, InvalidInput, InvalidRequest
from ferry.grpc import open_inference_codec as codec
from ferry.grpc.calls import on_hang_up, request_headers
from ferry.grpc.errors import error_code
from ferry.grpc.generated import ferry_open_inference_pb2 as pb
from ferry.grpc.generated import ferry_open_inference_pb2_grpc as pb_grpc
from ferry.protocols import v2
from ferry.service import FerryService
from ferry.service.types import InputPart, PredictionRequest, TensorSpec

SERVICE = "inference.GRPCInferenceService"
V2_ENVELOPE = "kservev2"
"""The request envelope REST's V2 requests are read with too (``ferry.http.kserve``)."""
EXTENSIONS = ["model_repository"]
"""What ``ServerMetadata`` lists (REST lists ``binary_tensor_data``, a JSON notion)."""
REPOSITORY_METHODS = frozenset(
    f"/{SERVICE}/{method}" for method in ("RepositoryModelLoad", "RepositoryModelUnload")
)
"""They load and unload models: the management key's calls, on whichever port."""

if TYPE_CHECKING:  # generic only in the stubs
    Context = aio.ServicerContext[Any, Any]


def parameters(entries: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """An ``InferParameter`` map as plain values; entries with no value set are dropped."""
    values = {}
    for key, entry in entries.items():
        kind = entry.WhichOneof("parameter_choice")
        if kind is not None:
            values[key] = getattr(entry, kind)
    return values


def input_tensor(tensor: pb.ModelInferRequest.InferInputTensor) -> codec.InputTensor:
    contents = {field.name: list(values) for field, values in tensor.contents.ListFields()}
    return codec.InputTensor(
        tensor.name, tensor.datatype, list(tensor.shape), parameters(tensor.parameters), contents
    )


def infer_request(
    request: pb.ModelInferRequest, max_elements: int | None = None
) -> v2.InferRequest:
    return codec.infer_request(
        request.id,
        parameters(request.parameters),
        [input_tensor(tensor) for tensor in request.inputs],
        list(request.raw_input_contents),
        [output.name for output in request.outputs],
        max_elements,
    )


def _output(tensor: codec.OutputTensor) -> pb.ModelInferResponse.InferOutputTensor:
    entry = pb.ModelInferResponse.InferOutputTensor(
        name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
    )
    for key, (kind, value) in tensor.parameters.items():
        setattr(entry.parameters[key], kind, value)
    return entry


def _spec(tensor: TensorSpec) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
    )


async def _fail(context: Context, error: FerryError) -> Never:
    await context.abort(error_code(error), capped_message(error.message))


class OpenInference(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: FerryService) -> None:
        self._service = service

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Context
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Context
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._service.ready())

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Context
    ) -> pb.ModelReadyResponse:
        try:
            readiness = self._service.readiness(request.name, request.version or None)
        except FerryError as error:
            await _fail(context, error)
        return pb.ModelReadyResponse(ready=readiness.ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="ferry", version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        try:
            metadata = self._service.metadata(request.name, request.version or None)
        except FerryError as error:
            await _fail(context, error)
        return pb.ModelMetadataResponse(
            name=metadata.name,
            versions=metadata.versions,
            platform=metadata.platform,
            inputs=[_spec(t) for t in metadata.inputs],
            outputs=[_spec(t) for t in metadata.outputs],
        )

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Context
    ) -> pb.ModelInferResponse:
        try:
            return await self._infer(request, context)
        except FerryError as error:
            await _fail(context, error)

    async def _infer(
        self, request: pb.ModelInferRequest, context: Context
    ) -> pb.ModelInferResponse:
        model, version = request.model_name, request.model_version or None
        admission = self._service.admit(model, version)  # NOT_FOUND / UNAVAILABLE first
        parsed = infer_request(request, self._service.settings.tensor_element_limit)
        payload, payload_type = parsed.worker_payload()
        headers = {**request_headers(context), "content-type": "application/json"}
        part = InputPart("body", payload_type, payload)
        prediction = PredictionRequest([part], headers, on_hang_up(context), envelope=V2_ENVELOPE)
        answer = await self._service.predict(admission, prediction)
        try:
            outputs, answer_id = v2.outputs_from_answer(answer.body, answer.content_type)
        except ValueError as exc:
            raise InvalidInput(f"the handler's answer is not a V2 response: {exc}") from exc
        tensors = codec.output_tensors(v2.select_outputs(outputs, parsed.outputs))
        ref = admission.model
        return pb.ModelInferResponse(
            model_name=ref.name,
            model_version=ref.version,
            id=codec.response_id(parsed, answer_id),
            outputs=[_output(tensor) for tensor in tensors],
            raw_output_contents=[tensor.raw for tensor in tensors],
        )

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        try:
            await self._load(request.model_name)
        except FerryError as error:
            await _fail(context, error)
        return pb.RepositoryModelLoadResponse()

    async def _load(self, name: str) -> None:
        """Register ``NAME.mar``; a model whose config starts no worker gets one, so that
        a loaded model takes requests (Triton's meaning), else it is unregistered again."""
        self._service.require_model_api()
        if not name:
            raise InvalidRequest("Parameter model_name is required.")
        registered = await self._service.register(codec.load_request(name))
        if registered.workers:
            return
        version = registered.model.version
        try:
            await self._service.scale(name, version, 1, 1, synchronous=True)
        except FerryError:
            with contextlib.suppress(FerryError):
                await self._service.unregister(name, version)
            raise

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        try:
            self._service.require_model_api()
            if not request.model_name:
                raise InvalidRequest("Parameter model_name is required.")
            await self._service.unregister(request.model_name, None)
        except FerryError as error:
            await _fail(context, error)
        return pb.RepositoryModelUnloadResponse()


def add_to_server(server: aio.Server, apis: Apis) -> None:
    """Serve ``inference.GRPCInferenceService`` on ``server``."""
    servicer = OpenInference(apis.service)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


__all__ = [
    "EXTENSIONS",
    "REPOSITORY_METHODS",
    "SERVICE",
    "OpenInference",
    "add_to_server",
    "infer_request",
]
