"""``SageMakerHandler``: a model written for SageMaker's PyTorch containers (an
``inference.py`` with ``model_fn``, ``input_fn``, ``predict_fn``, ``output_fn`` or
``transform_fn``, or none), served as Ferry's built-in handler ``sagemaker_pytorch``.

Each request runs on its own through ``transform_fn(model, body, content_type, accept)``:
the body as ``str`` for JSON and CSV, as bytes otherwise; ``Accept`` missing or ``*/*``
means ``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT``, else JSON. What ``transform_fn`` returns
is the answer, or ``(answer, content_type)``; the answer's type is otherwise the
``Accept`` asked for.

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

from ferry.handlers.contract.context import Context, RequestProcessor
from ferry.handlers.sagemaker import codecs
from ferry.handlers.sagemaker.defaults import pytorch_defaults, worker_device
from ferry.handlers.sagemaker.functions import (
    ServingFunctions,
    call,
    import_user_module,
    program_module,
    resolve,
)

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
        self.initialized = False

    def initialize(self, context: Context) -> None:
        """Import the user module, resolve its functions, and load the model."""
        model_dir = str(context.system_properties["model_dir"])
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
        """One answer per request of the batch, each transformed on its own."""
        return [self._answer(row, OneRequest(context, index)) for index, row in enumerate(data)]

    def _answer(self, row: Any, request: OneRequest) -> Any:
        assert self.functions is not None, "handle() before initialize()"
        content_type = request.get_request_header(0, "content-type") or ""
        accept = request.get_request_header(0, "accept") or ""
        if accept.strip() in ("", codecs.ANY):
            accept = self.default_accept
        try:
            body = request_body(row, content_type)
            args = (self.model, body, content_type, accept)
            result = call(self.functions.transform_fn, args, request)
        except Exception as exc:  # the toolkit answers every failure, by its status_code
            return error_answer(exc, request)
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
