"""TorchServe's request envelopes (``ts.torch_handler.request_envelope``): wrappers that
turn a protocol's request into the handler's rows and its answers back, chosen for every
model by ``service_envelope`` (``TS_SERVICE_ENVELOPE``; KServe sets ``kserve`` or
``kservev2``), so handlers written for TorchServe on KServe run unchanged. Without it,
TorchServe's handlers read each request through its own protocol's envelope
(``PerRequestEnvelopes``): KServe V1's through ``kserve``, the Open Inference Protocol's
through ``kservev2``, TorchServe's APIs' through none.

TorchServe's envelopes read only the first request of a batch (a batch of several fails);
Ferry's take every request's rows, run them through the handler together, and give each
request back its share of the answers, so these models batch like any other. With one
request in the batch they give the handler exactly what TorchServe's do.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from typing import Any

from ferry.errors import InvalidInput
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.loader import EntryPoint


class BaseEnvelope:
    """Subclass it with ``parse_input`` and ``format_output``; ``handle`` runs
    ``parse_input → handle_fn → format_output``."""

    def __init__(self, handle_fn: EntryPoint) -> None:
        self._handle_fn = handle_fn
        self.context: Context | None = None

    def handle(self, data: Any, context: Context) -> Any:
        self.context = context
        rows = self.parse_input(data) if data else data
        results = self._handle_fn(rows, context)
        return self.format_output(results) if results else results

    def parse_input(self, data: Any) -> Any:
        raise NotImplementedError

    def format_output(self, data: Any) -> Any:
        raise NotImplementedError


def _body(row: Any) -> Any:
    body = row.get("data") or row.get("body") if isinstance(row, dict) else row
    if not isinstance(body, bytes | bytearray):
        return body
    try:
        return json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError included
        raise InvalidInput(f"the request envelope expects a JSON body: {exc}") from exc


class _PerRequestRows(BaseEnvelope):
    """Each request gives some rows; the answers are split back by those counts."""

    def __init__(self, handle_fn: EntryPoint) -> None:
        super().__init__(handle_fn)
        self._counts: list[int] = []

    def parse_input(self, data: Any) -> list[Any]:
        per_request = [self.rows_of(index, _body(row)) for index, row in enumerate(data)]
        self._counts = [len(rows) for rows in per_request]
        return [row for rows in per_request for row in rows]

    def format_output(self, data: Any) -> list[Any]:
        answers = list(data)
        if len(answers) != sum(self._counts):
            raise ValueError(
                f"the handler answered {len(answers)} rows for {sum(self._counts)} inputs"
            )
        shares, start = [], 0
        for index, count in enumerate(self._counts):
            share = answers[start : start + count]
            # A row the handler failed (an exception in its place) fails its request alone.
            failure = next((a for a in share if isinstance(a, BaseException)), None)
            shares.append(failure if failure is not None else self.answer_for(index, share))
            start += count
        return shares

    def rows_of(self, index: int, body: Any) -> list[Any]:
        raise NotImplementedError

    def answer_for(self, index: int, answers: list[Any]) -> Any:
        raise NotImplementedError


class BodyEnvelope(BaseEnvelope):
    """``body``: each request's body (or ``data`` field) as it came."""

    def parse_input(self, data: Any) -> list[Any]:
        return [row.get("data") or row.get("body") for row in data]

    def format_output(self, data: Any) -> Any:
        return data


def _instances(body: Any) -> list[Any]:
    instances = body.get("instances") if isinstance(body, dict) else None
    if not isinstance(instances, list):
        raise InvalidInput('Expected "instances" to be a list')
    return instances


class JSONEnvelope(_PerRequestRows):
    """``json`` (TF Serving's format): every request's ``instances`` are rows, ``{"b64":
    ...}`` values decoded; each request gets ``{"predictions": [its answers]}`` as text."""

    def rows_of(self, index: int, body: Any) -> list[Any]:
        return [_decode_b64(instance) for instance in _instances(body)]

    def answer_for(self, index: int, answers: list[Any]) -> Any:
        return json.dumps({"predictions": answers})


def _decode_b64(instance: Any) -> Any:
    if isinstance(instance, dict):
        if set(instance) == {"b64"}:
            return base64.b64decode(instance["b64"])
        return {
            key: base64.b64decode(v["b64"]) if isinstance(v, dict) and set(v) == {"b64"} else v
            for key, v in instance.items()
        }
    return instance


class KServeEnvelope(_PerRequestRows):
    """``kserve`` (KServe V1): every request's ``instances`` are rows, undecoded; each
    request gets ``{"predictions": [...]}`` (``{"explanations": [...]}`` when explaining)."""

    def rows_of(self, index: int, body: Any) -> list[Any]:
        return list(_instances(body))

    def answer_for(self, index: int, answers: list[Any]) -> Any:
        context = self.context
        explaining = context is not None and context.get_request_header(index, "explain")
        return {"explanations" if explaining == "True" else "predictions": answers}


class KServev2Envelope(_PerRequestRows):
    """``kservev2`` (the Open Inference Protocol): each input tensor of a request is a row,
    its ``data`` shaped by its ``shape`` (BYTES: its first element); the answers become
    the request's ``outputs``, output ``i`` named after input ``i``, flattened."""

    def __init__(self, handle_fn: EntryPoint) -> None:
        super().__init__(handle_fn)
        self._requests: list[tuple[str | None, list[str]]] = []

    def parse_input(self, data: Any) -> list[Any]:
        self._requests = []
        return super().parse_input(data)

    def rows_of(self, index: int, body: Any) -> list[Any]:
        inputs = body.get("inputs") if isinstance(body, dict) else None
        if not isinstance(inputs, list):
            raise InvalidInput("expected an Open Inference Protocol request with 'inputs'")
        for tensor in inputs:
            if tensor.get("datatype") == "BYTES":
                tensor["data"] = tensor["data"][0]
            else:
                tensor["data"] = _reshape(list(_flatten(tensor.get("data"))), tensor.get("shape"))
        request_id = body.get("id")
        names = [str(tensor.get("name")) for tensor in inputs]
        self._requests.append((request_id if isinstance(request_id, str) else None, names))
        return inputs

    def answer_for(self, index: int, answers: list[Any]) -> Any:
        request_id, names = self._requests[index]
        context = self.context
        model = (context.manifest.get("model") or {}) if context is not None else {}
        if request_id is None and context is not None:
            request_id = context.get_request_id(index)
        outputs = []
        for position, answer in enumerate(answers):
            datatype, data = _typed_flat(answer)
            name = names[position] if position < len(names) else f"output-{position}"
            outputs.append({"name": name, "datatype": datatype, "data": data, "shape": [len(data)]})
        return {
            "id": request_id,
            "model_name": model.get("modelName", context.model_name if context else ""),
            "model_version": model.get("modelVersion", "1.0"),
            "outputs": outputs,
        }


def _flatten(data: Any) -> Iterator[Any]:
    if isinstance(data, list | tuple):
        for item in data:
            yield from _flatten(item)
    else:
        yield data


def _reshape(flat: list[Any], shape: Any) -> Any:
    if not isinstance(shape, list):
        raise InvalidInput(f"shape must be a list, got {shape!r}")
    dims = [int(d) for d in shape]
    if -1 in dims:  # one free dimension, as numpy infers it
        known = math.prod(d for d in dims if d != -1) or 1
        dims[dims.index(-1)] = len(flat) // known
    if math.prod(dims) != len(flat):
        raise InvalidInput(f"{len(flat)} values cannot take the shape {shape}")
    return _nest(flat, dims)


def _nest(flat: list[Any], dims: list[int]) -> Any:
    if not dims:
        return flat[0]
    if len(dims) == 1:
        return flat
    step = math.prod(dims[1:])
    return [_nest(flat[i * step : (i + 1) * step], dims[1:]) for i in range(dims[0])]


_TORCH_TYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}


def _typed_flat(answer: Any) -> tuple[str, list[Any]]:
    """An answer's datatype and flat values: a tensor's (or array's) own dtype, else by
    its values, as TorchServe's envelope types them through numpy."""
    dtype = getattr(answer, "dtype", None)
    if dtype is not None and hasattr(answer, "flatten"):
        name = str(dtype).removeprefix("torch.")
        values: list[Any] = answer.flatten().tolist()
        return _TORCH_TYPES.get(name, "BYTES"), values
    flat = list(_flatten(answer))
    if flat and all(isinstance(v, bool) for v in flat):
        return "BOOL", flat
    if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return "INT64", flat
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat):
        return "FP64", flat
    # Anything else as it is, a dict staying a JSON object: TorchServe's numpy typing
    # makes it one object element of a BYTES output, and its clients read it so.
    return "BYTES", flat


ENVELOPES: dict[str, type[BaseEnvelope]] = {
    "json": JSONEnvelope,
    "body": BodyEnvelope,
    "kserve": KServeEnvelope,
    "kservev2": KServev2Envelope,
}


def wrap(entry: EntryPoint, envelope: str) -> EntryPoint:
    """``entry`` inside the named envelope (``entry`` itself for none)."""
    if not envelope:
        return entry
    wrapped: EntryPoint = ENVELOPES[envelope](entry).handle
    return wrapped


class PerRequestEnvelopes:
    """``entry`` inside the envelope each request names (``RequestItem.envelope``, set by
    the protocol it came by), where no ``service_envelope`` wraps every request: one
    wrapped entry per envelope, made on first use and kept (an envelope keeps a batch's
    state between its ``parse_input`` and ``format_output``, so each has its own). ""
    is ``entry`` itself."""

    def __init__(self, entry: EntryPoint) -> None:
        self._entry = entry
        self._wrapped: dict[str, EntryPoint] = {"": entry}

    def __call__(self, envelope: str) -> EntryPoint:
        """The entry point for ``envelope``'s requests (``ValueError`` for no envelope of
        that name)."""
        wrapped = self._wrapped.get(envelope)
        if wrapped is None:
            if envelope not in ENVELOPES:
                raise ValueError(f"unknown request envelope {envelope!r}")
            wrapped = self._wrapped[envelope] = wrap(self._entry, envelope)
        return wrapped
