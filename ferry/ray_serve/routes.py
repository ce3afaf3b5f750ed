"""Which model version an inference-API path names: pure logic, so the router can send
the request to that model's replicas. Every path of Ferry's inference port that names a
model is here (TorchServe's, KServe V1, the Open Inference Protocol)."""

from __future__ import annotations

import re

_PATTERNS = [
    re.compile(p)
    for p in (
        r"^/(?:predictions|explanations|ping)/(?P<model>[^/]+)(?:/(?P<version>[^/]+))?/?$",
        r"^/v1/models/(?P<model>[^/:]+)(?::predict|:explain)?/?$",
        r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?(?:/infer|/explain|/ready)?/?$",
    )
]


def model_of(path: str) -> tuple[str, str | None] | None:
    """``(model, version or None)`` for a path that names a model, else None."""
    for pattern in _PATTERNS:
        match = pattern.match(path)
        if match:
            return match["model"], match.groupdict().get("version")
    return None
