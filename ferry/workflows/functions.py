"""Function nodes: the DAG nodes that are functions of the workflow's handler file.

TorchServe imports that file in its frontend's worker and calls each function at load
(``fn(None, context)``). Ferry never runs user code in the frontend: each function node is
served like a model, by a worker loading the handler ``<handler file>:<function>``. Here
the file is only read, with ``ast``, so that a node naming a function the file lacks is a
400 at registration instead of a worker that never loads.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ferry.errors import InvalidWorkflow
from ferry.workflows.spec import WorkflowSpec


def function_names(handler_path: Path) -> set[str]:
    """The names a function node may use: top-level ``def`` functions, top-level names
    bound to a ``lambda``, and names imported with ``from ... import`` (a handler file
    often re-exports shared steps). ``async def`` functions are left out: TorchServe's
    loader calls a function node without awaiting it."""
    names: set[str] = set()
    for statement in _parse(handler_path).body:
        if isinstance(statement, ast.FunctionDef):
            names.add(statement.name)
        elif isinstance(statement, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in statement.names)
        elif isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Lambda):
            names.update(t.id for t in statement.targets if isinstance(t, ast.Name))
    names.discard("*")
    return names


def check_function_nodes(spec: WorkflowSpec, handler_path: Path | None) -> None:
    """Raise ``InvalidWorkflow`` unless the handler file defines every function node."""
    if not spec.functions:
        return
    if handler_path is None:
        spec.require_functions((), "the workflow, which has no handler file")
        return
    spec.require_functions(function_names(handler_path), handler_path.name)


def function_handler(handler_path: Path, node: str) -> str:
    """The handler string a worker loads to run function node ``node`` (TorchServe's)."""
    return f"{handler_path}:{node}"


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_bytes(), filename=path.name)
    except SyntaxError as exc:
        raise InvalidWorkflow(f"{path.name}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except (OSError, ValueError) as exc:  # unreadable, or null bytes
        raise InvalidWorkflow(f"cannot read the workflow handler {path.name}: {exc}") from exc
