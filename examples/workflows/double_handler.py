"""The model node of the example workflow (docs/workflows.md): doubles each request's list
of numbers with torch. A module-level ``handle`` is TorchServe's simplest handler; this one
needs no weights."""

from __future__ import annotations

import json
from typing import Any

import torch


def handle(data: list[dict[str, Any]] | None, context: object) -> list[str] | None:
    if data is None:  # the call when the model loads
        return None
    rows = [json.loads(row.get("data") or row["body"]) for row in data]
    return [json.dumps((torch.tensor(row, dtype=torch.float64) * 2).tolist()) for row in rows]
