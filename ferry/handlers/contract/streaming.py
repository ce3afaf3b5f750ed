"""Streamed answers: TorchServe's ``send_intermediate_predict_response``.

A handler sends parts of a request's answer while its batch still runs; the worker forwards
each at once, and the transport passes it on (HTTP: one chunk of a chunked response). What
``handle()`` returns for the request is its last part.
"""

from __future__ import annotations

from typing import Any

from ferry.handlers.contract.context import IntermediateResponse


def send_intermediate_predict_response(
    ret: Any, req_id_map: Any, message: str, code: int, context: Any = None
) -> None:
    """TorchServe's streamed partial answer: ``ret[i]`` goes to request ``req_id_map[i]``
    now, ahead of what ``handle()`` returns for it (the last part)."""
    if context is None or not hasattr(context, "send_intermediate"):
        raise TypeError("send_intermediate_predict_response needs the handler's context")
    if not isinstance(ret, list | tuple):
        raise TypeError(f"ret must be a list with one output per request, not {type(ret)}")
    for index, output in enumerate(ret):
        if index not in req_id_map:
            raise ValueError(f"req_id_map has no request for output {index}")
        part = IntermediateResponse(str(req_id_map[index]), output, int(code), str(message))
        context.send_intermediate(part)
