"""The batch policies a model may name (``batchPolicy``), declared once.

Each policy is a ``PolicyKind``: its name, a factory taking the model's policy options
(a mapping of model-config.yaml keys to values already read), the options it reads, and
what it does for a stateful model (``sequenceBatching``). Everything that knows policies
reads ``BATCH_POLICIES``: model-config.yaml's validation (``ferry.config.model_config``),
the management API's switch (``PUT /models/M?batch_policy=NAME&OPTION=VALUE``) and its
description, snapshots, ``ferry bench limit --batch-policy`` and the runner. A new policy,
parameter and all, is one ``register`` call beside its class::

    BATCH_POLICIES.register(
        PolicyKind(
            "slo_window",
            lambda options: SloWindowPolicy(options.get("windowMs", 10.0) / 1000),
            "waits up to windowMs for a fuller batch",
            options=(PolicyOption("windowMs", "how long a batch may wait", minimum=0.0),),
        )
    )

Options are numbers (milliseconds, counts), bounded below; ``ferry.config`` reads them, from
YAML or the management API's text, with the same messages as its own keys.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ferry.batching.policies import (
    AdaptivePolicy,
    BatchPolicy,
    FixedWindowPolicy,
    ImmediatePolicy,
)

DEFAULT_POLICY = "adaptive"


@dataclass(frozen=True)
class PolicyOption:
    """One parameter a policy reads: a number, a top-level model-config.yaml key."""

    key: str
    """As model-config.yaml and describe spell it (``latencyObjectiveMs``)."""
    description: str
    minimum: float = 0.0
    above_minimum: bool = False
    """The value must exceed ``minimum``, not only reach it."""
    integer: bool = False

    @property
    def param(self) -> str:
        """The management API's query parameter (``latency_objective_ms``)."""
        return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", self.key).lower()


@dataclass(frozen=True)
class PolicyKind:
    name: str
    make: Callable[[Mapping[str, Any]], BatchPolicy]
    """The policy, from the options the model sets (any policy's: read your own)."""
    description: str
    options: tuple[PolicyOption, ...] = ()
    serves_sequences: bool = True
    """Whether a stateful model may batch with it; False: such a model refuses it."""
    sequences_wait: bool = False
    """For a stateful model: a batch short of full waits up to ``maxBatchDelay`` for more
    sequences' requests (TorchServe's rule), rather than going with what is ready."""


class PolicyRegistry:
    """Policies by name, in the order registered (the order error messages list them)."""

    def __init__(self) -> None:
        self._kinds: dict[str, PolicyKind] = {}

    def register(self, kind: PolicyKind) -> PolicyKind:
        if kind.name in self._kinds:
            raise ValueError(f"batch policy {kind.name!r} is already registered")
        self._kinds[kind.name] = kind
        return kind

    def unregister(self, name: str) -> None:
        self._kinds.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def kind(self, name: str) -> PolicyKind:
        """The policy called ``name``; ``ValueError`` naming the others if there is none."""
        found = self._kinds.get(name)
        if found is None:
            raise ValueError(f"unknown batch policy {name!r}; one of {', '.join(self._kinds)}")
        return found

    def options(self) -> tuple[PolicyOption, ...]:
        """Every policy's options, each key once (policies may share one)."""
        found: dict[str, PolicyOption] = {}
        for kind in self._kinds.values():
            for option in kind.options:
                found.setdefault(option.key, option)
        return tuple(found.values())

    def make(self, name: str, options: Mapping[str, Any] | None = None) -> BatchPolicy:
        """The policy called ``name`` with the model's ``options`` (``ValueError`` for an
        unknown name)."""
        return self.kind(name).make(options or {})


def _adaptive(options: Mapping[str, Any]) -> BatchPolicy:
    objective_ms = options.get(LATENCY_OBJECTIVE.key)
    return AdaptivePolicy(None if objective_ms is None else objective_ms / 1000)


LATENCY_OBJECTIVE = PolicyOption(
    "latencyObjectiveMs",
    "the adaptive policy never holds a request so long that it would miss this",
    above_minimum=True,
)

BATCH_POLICIES = PolicyRegistry()
BATCH_POLICIES.register(
    PolicyKind(
        "adaptive",
        _adaptive,
        "takes what is queued now unless waiting pays (learned batch costs, arrival rate)",
        options=(LATENCY_OBJECTIVE,),
    )
)
BATCH_POLICIES.register(
    PolicyKind(
        "immediate",
        lambda options: ImmediatePolicy(),
        "takes what is queued now (Triton's default)",
    )
)
BATCH_POLICIES.register(
    PolicyKind(
        "fixed_window",
        lambda options: FixedWindowPolicy(),
        "waits up to maxBatchDelay for a full batch (TorchServe's)",
        sequences_wait=True,
    )
)


def make_policy(name: str, options: Mapping[str, Any] | None = None) -> BatchPolicy:
    """``BATCH_POLICIES.make``: the policy called ``name`` with ``options``."""
    return BATCH_POLICIES.make(name, options)


__all__ = [
    "BATCH_POLICIES",
    "DEFAULT_POLICY",
    "LATENCY_OBJECTIVE",
    "PolicyKind",
    "PolicyOption",
    "PolicyRegistry",
    "make_policy",
]
