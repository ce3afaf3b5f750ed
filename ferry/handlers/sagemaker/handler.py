"""``SageMakerHandler``: a model written for SageMaker's PyTorch containers (an
``inference.py`` with ``model_fn``, ``input_fn``, ``predict_fn``, ``output_fn`` or
``transform_fn``, or none), served as Ferry's built-in handler ``sagemaker_pytorch``.

Each request runs through ``transform_fn(model, body, content_type, accept)``: the body
as ``str`` for JSON and CSV, as bytes otherwise; ``Accept`` missing or ``*/*`` means
``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT``, else JSON. What ``transform_fn`` returns is the
answer, or ``(answer, content_type)``; the answer's type is otherwise the ``Accept``
asked for. In a batch of several requests, unless the module has its own
``transform_fn``, the inputs that stack go through one ``predict_fn`` call
(``ferry.handlers.sagemaker.batching``); each request still has its own ``input_fn`` and
``output_fn``, and its own answer or error.

Errors are answered as the toolkit answers them: an exception that carries
``status_code`` (the toolkit's ``BaseInferenceToolkitError``) with that status and its
``message``, any other with 500 and its text; the body is the message as plain text (the
toolkit adds the traceback, which Ferry logs instead). A model that fails to load (its
module, ``model_fn``) fails the worker's load, as on SageMaker.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from ferry.handlers.contract.context import Context, RequestProcessor
from ferry.handlers.sagemaker import codecs
from ferry.handlers.sagemaker.batching import split_rows, stackable_groups
from ferry.handlers.sagemaker.defaults import pytorch_defaults, worker_device
from ferry.handlers.sagemaker.functions import (
    ServingFunctions,
    call,
    import_user_module,
    program_module,
    resolve,
)
from ferry.handlers.sagemaker.toolkit import add_shims

log = logging.getLogger("ferry.handlers")

DEFAULT_ACCEPT_VARIABLE = "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT"
"""The type answered when a request's ``Accept`` is missing or ``*/*`` (JSON unless set)."""
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"
"""SageMaker's per-request header for the model; user functions that take the context
read it with ``context.get_request_header(0, CUSTOM_ATTRIBUTES_HEADER)``."""


class SageMakerHandler:
    """TorchServe's handler shape (``initialize``, ``handle``) over the toolkit's functions."""

    def __init__(self) -> None:
        self.functions: ServingFunctions | None = None
        self.model: Any = None
        self.default_accept = codecs.JSON
        self.predicts_together = True
        """Whether a batch's inputs that stack go through one ``predict_fn`` call."""
        self.initialized = False

    def initialize(self, context: Context) -> None:
        """Import the user module, resolve its functions, and load the model."""
        model_dir = str(context.system_properties["model_dir"])
        add_shims()  # before the user's module: it may import sagemaker_inference
        program = program_module(os.environ)
        module = import_user_module(Path(model_dir) / "code", program)
        if module is None:
            log.info("no module %s in %s/code: the default functions serve it", program, model_dir)
        device = worker_device(context.system_properties.get("gpu_id"))
        functions = resolve(module, pytorch_defaults(device))
        if functions.pre_model_fn is not None:
            call(functions.pre_model_fn, (model_dir,), context)
        self.model = call(functions.model_fn, (model_dir,), context)
        if functions.model_warmup_fn is not None:
            call(functions.model_warmup_fn, (model_dir, self.model), context)
        self.functions = functions
        self.default_accept = os.environ.get(DEFAULT_ACCEPT_VARIABLE) or codecs.JSON
        self.initialized = True

    def handle(self, data: list[Any], context: Context) -> list[Any]:
        """One answer per request of the batch: each transformed on its own, or, for
        several requests, their predictions made together where the inputs stack."""
        requests = [OneRequest(context, index) for index in range(len(data))]
        assert self.functions is not None, "handle() before initialize()"
        if len(data) > 1 and self.predicts_together and not self.functions.own_transform:
            return self._answer_together(data, requests)
        return [self._answer(row, request) for row, request in zip(data, requests, strict=True)]

    def _types(self, request: OneRequest) -> tuple[str, str]:
        """The request's ``Content-Type`` and ``Accept`` (the default one for none or ``*/*``)."""
        content_type = request.get_request_header(0, "content-type") or ""
        accept = request.get_request_header(0, "accept") or ""
        if accept.strip() in ("", codecs.ANY):
            accept = self.default_accept
        return content_type, accept

    def _answer(self, row: Any, request: OneRequest) -> Any:
        assert self.functions is not None, "handle() before initialize()"
        content_type, accept = self._types(request)
        try:
            body = request_body(row, content_type)
            args = (self.model, body, content_type, accept)
            result = call(self.functions.transform_fn, args, request)
        except Exception as exc:  # the toolkit answers every failure, by its status_code
            return error_answer(exc, request)
        return _answered(result, accept, request)

    def _answer_together(self, rows: list[Any], requests: list[OneRequest]) -> list[Any]:
        """``input_fn`` per request, ``predict_fn`` per group of inputs that stack (else per
        request), ``output_fn`` per request; a failure answers its request alone."""
        assert self.functions is not None, "handle() before initialize()"
        answers: dict[int, Any] = {}
        inputs: dict[int, Any] = {}
        for index, (row, request) in enumerate(zip(rows, requests, strict=True)):
            content_type = self._types(request)[0]
            try:
                body = request_body(row, content_type)
                inputs[index] = call(self.functions.input_fn, (body, content_type), request)
            except Exception as exc:
                answers[index] = error_answer(exc, request)
        predicted = self._predict_together(inputs, requests)
        for index, data in inputs.items():
            request, accept = requests[index], self._types(requests[index])[1]
            try:
                if index in predicted:
                    prediction = predicted[index]
                else:
                    prediction = call(self.functions.predict_fn, (data, self.model), request)
                result = call(self.functions.output_fn, (prediction, accept), request)
            except Exception as exc:
                answers[index] = error_answer(exc, request)
                continue
            answers[index] = _answered(result, accept, request)
        return [answers[index] for index in range(len(rows))]

    def _predict_together(
        self, inputs: dict[int, Any], requests: list[OneRequest]
    ) -> dict[int, Any]:
        """Each request's share of one ``predict_fn`` call per group of inputs that stack;
        the inputs left out run alone. A call that fails leaves its group to run alone
        (each request then gets its own answer or error); a prediction that is not one
        row per input row does too, and stops this model's batched predictions."""
        assert self.functions is not None, "handle() before initialize()"
        predicted: dict[int, Any] = {}
        for group in stackable_groups(inputs):
            stacked = torch.cat([inputs[index] for index in group])
            try:
                args = (stacked, self.model)
                prediction = call(self.functions.predict_fn, args, requests[group[0]])
            except Exception:  # one input's fault, perhaps: each runs alone and answers
                log.debug("predict_fn failed on %d stacked inputs", len(group), exc_info=True)
                continue
            parts = split_rows(prediction, [inputs[index].shape[0] for index in group])
            if parts is None:
                self.predicts_together = False
                log.warning(
                    "predict_fn's answer to %d stacked inputs is not one row per input row: "
                    "this model's requests run alone from now on",
                    len(group),
                )
                break
            predicted.update(zip(group, parts, strict=True))
        return predicted


def _answered(result: Any, accept: str, request: OneRequest) -> Any:
    """The answer of ``transform_fn`` or ``output_fn``, its type set on the request."""
    answer, answer_type = result if isinstance(result, tuple) else (result, accept)
    request.set_response_content_type(0, answer_type)
    return answer


def request_body(row: Any, content_type: str) -> Any:
    """The request's body as the toolkit hands it to ``input_fn``: ``str`` for JSON and
    CSV, ``bytes`` otherwise. Ferry's ``/invocations`` sends it undecoded; a body that
    came through ``/predictions`` may already be parsed (JSON) or text: written back."""
    body = row.get("body", row.get("data")) if isinstance(row, dict) else row
    if not isinstance(body, (bytes, bytearray, str)):
        body = json.dumps(body)
    if codecs.media_type(content_type) in codecs.TEXT_TYPES:
        return codecs.as_text(body)
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def error_answer(exc: Exception, request: OneRequest) -> str:
    """The toolkit's answer to a failed request: its ``status_code`` (else 500), and the
    message as the body."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status < 600:
        message = str(getattr(exc, "message", None) or exc)
    else:
        status, message = 500, str(exc) or type(exc).__name__
    log.error("transform failed for model %s", request.model_name, exc_info=exc)
    phrase = message.replace("\r", " ").replace("\n", " ")
    request.set_response_status(status, phrase, 0)
    request.set_response_content_type(0, "text/plain; charset=utf-8")
    return message


class OneRequest:
    """The handler's context narrowed to one request of the batch, as the toolkit's
    functions expect it: request 0 is this one (headers, status, content type); every
    other attribute is the context's."""

    def __init__(self, context: Context, index: int) -> None:
        self._context = context
        self._index = index

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    @property
    def request_processor(self) -> list[RequestProcessor]:
        return [self._context.request_processor[self._index]]

    def get_request_id(self, idx: int = 0) -> str | None:
        return self._context.get_request_id(self._index)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self._context.get_request_header(self._index, key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self._context.get_all_request_header(self._index)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self._context.set_response_content_type(self._index, value)

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self._context.set_response_status(code, phrase, self._index)

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self._context.set_response_header(self._index, key, value)
