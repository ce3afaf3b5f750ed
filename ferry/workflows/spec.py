"""A workflow's spec file (TorchServe's ``workflow.yaml``): the ``models:`` it runs and the
``dag:`` that wires them, parsed and validated once, when the workflow is registered.

    models:
      min-workers: 1          # a global: applies to the model entries written after it
      preprocessing-net:
        url: pre.mar
        batch-size: 4         # a per-model override
    dag:
      pre_fn: [preprocessing-net]     # pre_fn is not a model: a function of the handler file
      preprocessing-net: [post_fn]

Where Ferry is stricter than TorchServe, a typo or a wrong type is a 400 naming the key
instead of a workflow that silently runs another configuration.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ferry.config.model_config import MAX_DOCUMENT_BYTES, load_yaml
from ferry.errors import InvalidWorkflow, ModelConfigError

NODE_SEPARATOR = "__"
"""Between the workflow's name and a node's in the internal model name (TorchServe's)."""

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
"""A node becomes the model ``<workflow>__<node>``, so it must make a valid model name."""


@dataclass(frozen=True)
class WorkflowGlobals:
    """The six keys of ``models:`` that are not model entries, with TorchServe's defaults."""

    min_workers: int = 1
    max_workers: int = 1
    batch_size: int = 1
    max_batch_delay_ms: int = 50
    retry_attempts: int = 1
    """How many times a failed node is tried again (so ``retry_attempts + 1`` attempts)."""
    timeout_ms: int = 10000
    """How long one attempt of a node may take."""


@dataclass(frozen=True)
class ModelNode:
    """A node's settings. ``url`` is the archive in the model store (or a URL) of a model
    node, and None for a function node."""

    name: str
    url: str | None
    min_workers: int
    max_workers: int
    batch_size: int
    max_batch_delay_ms: int
    retry_attempts: int
    timeout_ms: int

    @property
    def is_function(self) -> bool:
        return self.url is None


# YAML key -> (field name, smallest value allowed).
_SETTING_KEYS: dict[str, tuple[str, int]] = {
    "min-workers": ("min_workers", 0),
    "max-workers": ("max_workers", 1),
    "batch-size": ("batch_size", 1),
    "max-batch-delay": ("max_batch_delay_ms", 0),
    "retry-attempts": ("retry_attempts", 0),
    "timeout-ms": ("timeout_ms", 1),
}


@dataclass(frozen=True)
class WorkflowSpec:
    models: dict[str, ModelNode]
    """The model nodes of the DAG, by node name; entries of ``models:`` the DAG does not
    name are left out, since TorchServe registers only the DAG's nodes."""
    functions: list[str]
    """DAG nodes that are not models: functions of the workflow's handler file."""
    dag: dict[str, list[str]]
    """``dag:`` as written: node -> children (nodes that only appear as children have no key)."""
    nodes: list[str]
    """Every node, in order of first appearance in ``dag:``."""
    start: str
    leaves: list[str]
    globals: WorkflowGlobals
    """The global values once all of ``models:`` is read (what describe reports, and the
    retry and timeout settings of function nodes)."""

    def children(self, node: str) -> list[str]:
        return self.dag.get(node, [])

    def parents(self, node: str) -> list[str]:
        """The nodes whose output ``node`` takes, in DAG order (the order of its input parts)."""
        return [name for name in self.nodes if node in self.children(name)]

    def topological_order(self) -> list[str]:
        """Every node after all its parents; the same order every time for a given spec."""
        order = _topological_order(self.nodes, self.dag)
        assert order is not None  # parse_spec refused cycles
        return order

    def node(self, name: str) -> ModelNode:
        """A node's settings; a function node runs with one worker, batches of one, no
        batch delay, and the global retry and timeout settings (TorchServe's)."""
        if name in self.models:
            return self.models[name]
        if name not in self.functions:
            raise KeyError(name)
        g = self.globals
        return ModelNode(name, None, 1, 1, 1, 0, g.retry_attempts, g.timeout_ms)

    def require_functions(self, available: Collection[str], handler: str) -> None:
        """Raise ``InvalidWorkflow`` unless every function node is in ``available`` (the
        functions ``handler`` defines)."""
        missing = [name for name in self.functions if name not in available]
        if missing:
            raise InvalidWorkflow(
                f"dag node{'s' if len(missing) > 1 else ''} {', '.join(missing)}: neither a "
                f"model in 'models:' nor a function defined in {handler}"
            )


def internal_name(workflow: str, node: str) -> str:
    """The model name a node is registered under, TorchServe's ``<workflow>__<node>``."""
    return f"{workflow}{NODE_SEPARATOR}{node}"


def load_spec(path: Path) -> WorkflowSpec:
    """Read and validate a spec file."""
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise InvalidWorkflow(f"{path.name}: over 1 MiB; not a workflow spec")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidWorkflow(f"cannot read the workflow spec {path.name}: {exc}") from exc
    return parse_spec(text, path.name)


def parse_spec(text: str, source: str = "workflow spec") -> WorkflowSpec:
    """Parse a spec's YAML text; ``source`` names it in error messages."""
    try:
        document = load_yaml(text, source)  # refuses alias bombs
    except ModelConfigError as exc:
        raise InvalidWorkflow(exc.message) from exc
    if not isinstance(document, dict):
        raise InvalidWorkflow(f"{source}: expected a mapping with 'models' and 'dag'")
    unknown = [str(key) for key in document if key not in ("models", "dag")]
    if unknown:
        raise InvalidWorkflow(f"{source}: unknown key {unknown[0]!r} (expected 'models' and 'dag')")
    dag = _read_dag(document.get("dag"), source)
    nodes = list(_nodes_in_order(dag))
    start, leaves = _check_dag(nodes, dag)
    all_models, final_globals = _read_models(document.get("models"), source)
    return WorkflowSpec(
        models={name: node for name, node in all_models.items() if name in nodes},
        functions=[name for name in nodes if name not in all_models],
        dag=dag,
        nodes=nodes,
        start=start,
        leaves=leaves,
        globals=final_globals,
    )


def _read_models(section: Any, source: str) -> tuple[dict[str, ModelNode], WorkflowGlobals]:
    """Model entries and the final globals. A global applies to the entries written
    after it only, as in TorchServe, which reads them in one pass in YAML order."""
    if section is None:
        return {}, WorkflowGlobals()
    if not isinstance(section, dict):
        raise InvalidWorkflow(f"{source}: 'models' must be a mapping")
    current = WorkflowGlobals()
    models: dict[str, ModelNode] = {}
    for key, value in section.items():
        if key in _SETTING_KEYS:
            field_name, low = _SETTING_KEYS[key]
            current = replace(current, **{field_name: _integer(value, f"models.{key}", low)})
        else:
            name = _node_name(key, source)
            models[name] = _model_node(name, value, current)
    return models, current


def _model_node(name: str, entry: Any, current: WorkflowGlobals) -> ModelNode:
    if not isinstance(entry, dict):
        raise InvalidWorkflow(f"models.{name} must be a mapping with a 'url'")
    unknown = [str(key) for key in entry if key != "url" and key not in _SETTING_KEYS]
    if unknown:
        allowed = ", ".join(["url", *_SETTING_KEYS])
        raise InvalidWorkflow(f"models.{name}: unknown key {unknown[0]!r} (allowed: {allowed})")
    url = entry.get("url")
    if not isinstance(url, str) or not url.strip():
        raise InvalidWorkflow(f"models.{name} has no 'url' (the model's archive or URL)")
    settings = {f.name: getattr(current, f.name) for f in fields(WorkflowGlobals)}
    for key, (field_name, low) in _SETTING_KEYS.items():
        if key in entry:
            settings[field_name] = _integer(entry[key], f"models.{name}.{key}", low)
    return ModelNode(name=name, url=url.strip(), **settings)


def _integer(value: Any, where: str, low: int) -> int:
    # bool is an int to Python, but ``retry-attempts: yes`` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidWorkflow(f"{where} must be an integer, not {value!r}")
    if value < low:
        raise InvalidWorkflow(f"{where} must be at least {low}, not {value}")
    return value


def _node_name(value: Any, source: str) -> str:
    if not isinstance(value, str) or not _NODE_NAME.match(value):
        raise InvalidWorkflow(
            f"{source}: invalid node name {value!r}: use letters, digits, '_', '-' and '.', "
            "starting with a letter or digit"
        )
    return value


def _read_dag(section: Any, source: str) -> dict[str, list[str]]:
    if section is None or section == {}:
        raise InvalidWorkflow(f"{source}: the 'dag' is empty; a workflow needs at least one node")
    if not isinstance(section, dict):
        raise InvalidWorkflow(f"{source}: 'dag' must be a mapping of node -> list of children")
    dag: dict[str, list[str]] = {}
    for key, value in section.items():
        node = _node_name(key, source)
        dag[node] = _children(node, value, source)
    return dag


def _children(node: str, value: Any, source: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidWorkflow(f"dag.{node} must be a list of child nodes, not {value!r}")
    children: list[str] = []
    for item in value:
        if item is None or (isinstance(item, str) and not item.strip()):
            continue  # TorchServe skips blank children
        child = _node_name(item, source)
        if child == node:
            raise InvalidWorkflow(f"Self loop exception: dag node {node!r} is its own child")
        if child in children:
            # TorchServe's message for an edge added twice.
            raise InvalidWorkflow(
                f"loop exception: {child!r} is listed twice as a child of {node!r}"
            )
        children.append(child)
    return children


def _nodes_in_order(dag: Mapping[str, list[str]]) -> Iterator[str]:
    seen: set[str] = set()
    for node, children in dag.items():
        for name in (node, *children):
            if name not in seen:
                seen.add(name)
                yield name


def _check_dag(nodes: list[str], dag: Mapping[str, list[str]]) -> tuple[str, list[str]]:
    """The start node and the leaves, in TorchServe's order of checks: one start node,
    then no cycle."""
    has_parent = {child for children in dag.values() for child in children}
    starts = [name for name in nodes if name not in has_parent]
    if len(starts) != 1:
        found = ", ".join(starts) if starts else "none: every node has a parent"
        raise InvalidWorkflow(f"DAG should have only one start node; found {found}")
    if _topological_order(nodes, dag) is None:
        raise InvalidWorkflow("Not a valid DAG: its edges form a cycle")
    return starts[0], [name for name in nodes if not dag.get(name)]


def _topological_order(nodes: list[str], dag: Mapping[str, list[str]]) -> list[str] | None:
    """Kahn's algorithm, stable in ``nodes`` order; None when there is a cycle."""
    waiting = {name: 0 for name in nodes}
    for children in dag.values():
        for child in children:
            waiting[child] += 1
    order: list[str] = []
    ready = [name for name in nodes if waiting[name] == 0]
    while ready:
        node = ready.pop(0)
        order.append(node)
        for child in dag.get(node, []):
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    return order if len(order) == len(nodes) else None
