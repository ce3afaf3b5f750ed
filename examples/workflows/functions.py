"""The function nodes of the example workflow (docs/workflows.md), written as TorchServe's
workflow handlers are: ``fn(data, context)`` over a batch of requests, one answer each."""

from __future__ import annotations

import json
from typing import Any


def pre_processing(data: list[dict[str, Any]] | None, context: object) -> list[str] | None:
    if data is None:  # called once with None when the workflow loads
        return data
    # each request's JSON body, a list of numbers, checked and passed on
    return [json.dumps([float(value) for value in _body(row)]) for row in data]


def post_processing(
    data: list[dict[str, Any]] | None, context: object
) -> list[dict[str, Any]] | None:
    if data is None:
        return data
    # a node with one parent gets its answer as the body (bytes)
    return [{"doubled": _body(row)} for row in data]


def _body(row: dict[str, Any]) -> Any:
    return json.loads(row.get("data") or row["body"])
