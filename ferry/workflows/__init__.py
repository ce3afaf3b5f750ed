"""TorchServe-compatible workflows: a DAG of models and handler functions served as one
endpoint. This package is the transport-neutral core: the spec (``spec``), the ``.war``
archive (``war``), the function nodes (``functions``) and one request's run over the DAG
(``executor``). Registering each node as a model is the service's job.
"""

from ferry.errors import InvalidWorkflow
from ferry.workflows.executor import (
    PredictNode,
    WorkflowAnswer,
    WorkflowFailed,
    WorkflowNodeFailed,
    run_workflow,
)
from ferry.workflows.functions import check_function_nodes, function_handler, function_names
from ferry.workflows.spec import (
    ModelNode,
    WorkflowGlobals,
    WorkflowSpec,
    internal_name,
    load_spec,
    parse_spec,
)
from ferry.workflows.war import WarManifest, WorkflowArchive, open_war, war_in_store, write_war

__all__ = [
    "InvalidWorkflow",
    "ModelNode",
    "PredictNode",
    "WarManifest",
    "WorkflowAnswer",
    "WorkflowArchive",
    "WorkflowFailed",
    "WorkflowGlobals",
    "WorkflowNodeFailed",
    "WorkflowSpec",
    "check_function_nodes",
    "function_handler",
    "function_names",
    "internal_name",
    "load_spec",
    "open_war",
    "parse_spec",
    "run_workflow",
    "war_in_store",
    "write_war",
]
