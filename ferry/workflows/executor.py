"""Run one workflow request over its DAG, TorchServe's way, with no transport in sight.

How each node runs (a prediction on the model ``<workflow>__<node>``) is the caller's
``predict_node``; this module only decides what each node receives and when it starts:

- the start node gets the client's parts;
- a node with one parent gets a single part ``body`` holding the parent's output;
- a node with several parents gets one part per parent, named after it;
- every node gets the client's headers;
- a node starts once all its parents finished, so independent branches run concurrently;
- a failing or slow attempt is tried again ``retry_attempts`` times, each attempt bounded
  by ``timeout_ms``; but a start node that finds the client's own input invalid
  (``InvalidInput``: a body it cannot decode) fails the request with it at once (400),
  where TorchServe retries and answers 500: no attempt can decode it.

One leaf answers with its bytes; several answer with ``{leaf: its output as a JSON object}``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ferry.errors import HandlerFailed, InvalidInput
from ferry.protocols import untrusted_json
from ferry.service.types import InputPart
from ferry.workflows.spec import WorkflowSpec

PredictNode = Callable[[str, list[InputPart], dict[str, str]], Awaitable[bytes]]
"""``(node name, input parts, client headers) -> the node's output bytes``."""

PARENT_OUTPUT_TYPE = ""
"""The content type of a part holding a parent's output. TorchServe sets none, so the
node's handler gets the raw bytes whatever they hold; "" does the same in Ferry's worker,
where "application/octet-stream" would claim a type the parent never declared."""


class WorkflowFailed(HandlerFailed):
    """A workflow request failed (500, as TorchServe answers any workflow failure)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=500)


class WorkflowNodeFailed(WorkflowFailed):
    """A node failed on every attempt; ``reason`` is what its last attempt raised."""

    def __init__(self, node: str, attempts: int, reason: str) -> None:
        super().__init__(
            f"Failed to execute workflow Node after {attempts} attempts : "
            f"Error executing {node} ({reason})"
        )
        self.node = node
        self.attempts = attempts
        self.reason = reason


@dataclass(frozen=True)
class WorkflowAnswer:
    body: bytes
    content_type: str = "application/json"
    """Always JSON, as TorchServe answers, whatever the leaf returned."""


async def run_workflow(
    spec: WorkflowSpec,
    parts: Sequence[InputPart],
    headers: Mapping[str, str],
    predict_node: PredictNode,
) -> WorkflowAnswer:
    """Run every node of ``spec`` for one request and combine the leaves' outputs.

    Raises ``WorkflowNodeFailed`` when a node fails on every attempt (the nodes still
    running are cancelled), ``WorkflowFailed`` when several leaves do not all answer a
    JSON object.
    """
    run = _Run(spec, list(parts), dict(headers), predict_node)
    outputs = await run.outputs()
    return _combine(spec.leaves, outputs)


class _Run:
    """One request's pass over the DAG: a task per node, each awaiting its parents'."""

    def __init__(
        self,
        spec: WorkflowSpec,
        parts: list[InputPart],
        headers: dict[str, str],
        predict_node: PredictNode,
    ) -> None:
        self.spec = spec
        self.parts = parts
        self.headers = headers
        self.predict_node = predict_node
        self.tasks: dict[str, asyncio.Task[bytes]] = {}

    async def outputs(self) -> dict[str, bytes]:
        """The leaves' outputs; on the first failure, the other nodes are cancelled."""
        for node in self.spec.topological_order():  # parents' tasks exist before children's
            self.tasks[node] = asyncio.create_task(self._node(node), name=f"workflow:{node}")
        leaves = [self.tasks[leaf] for leaf in self.spec.leaves]
        try:
            results = await asyncio.gather(*leaves)
        finally:
            for task in self.tasks.values():
                task.cancel()
            # Collect every task, so none is left with an exception nobody retrieved.
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        return dict(zip(self.spec.leaves, results, strict=True))

    async def _node(self, node: str) -> bytes:
        parents = self.spec.parents(node)
        if not parents:
            return await self._attempts(node, self.parts, client_input=True)
        parent_tasks = [self.tasks[parent] for parent in parents]
        # asyncio.wait, not gather: a child must not cancel a parent other children share.
        await asyncio.wait(parent_tasks)
        outputs = [task.result() for task in parent_tasks]  # a parent's failure is ours
        if len(parents) == 1:
            inputs = [InputPart("body", PARENT_OUTPUT_TYPE, outputs[0])]
        else:
            inputs = [
                InputPart(parent, PARENT_OUTPUT_TYPE, output)
                for parent, output in zip(parents, outputs, strict=True)
            ]
        return await self._attempts(node, inputs)

    async def _attempts(
        self, node: str, parts: list[InputPart], *, client_input: bool = False
    ) -> bytes:
        settings = self.spec.node(node)
        attempts = settings.retry_attempts + 1
        reason = ""
        for _ in range(attempts):
            try:
                return await asyncio.wait_for(
                    self.predict_node(node, list(parts), dict(self.headers)),
                    settings.timeout_ms / 1000,
                )
            except InvalidInput as exc:  # no retry decodes the client's own body
                if client_input:
                    raise
                reason = str(exc)
            except TimeoutError:
                reason = f"no answer within {settings.timeout_ms} ms"
            except Exception as exc:  # TorchServe retries whatever went wrong
                reason = str(exc) or type(exc).__name__
        raise WorkflowNodeFailed(node, attempts, reason)


def _combine(leaves: list[str], outputs: dict[str, bytes]) -> WorkflowAnswer:
    if len(leaves) == 1:
        return WorkflowAnswer(outputs[leaves[0]])
    combined = {leaf: _json_object(leaf, outputs[leaf]) for leaf in leaves}
    try:
        return WorkflowAnswer(json.dumps(combined).encode())
    except RecursionError:
        raise WorkflowFailed("the workflow's leaves answered JSON nested too deeply") from None


def _json_object(leaf: str, output: bytes) -> dict[str, Any]:
    try:
        value = untrusted_json.loads(output)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise WorkflowFailed(
            f"workflow leaf {leaf!r} did not answer a JSON object; with several leaves, "
            "each must, to be combined into one answer"
        )
    return value
