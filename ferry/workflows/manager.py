"""Registered workflows over the service: each node a model named ``<workflow>__<node>``,
batched and scaled as any model; a request runs the DAG through ``service.predict``.

TorchServe's rules, kept: the ``.war`` comes from the workflow store (the model store when
none is set), each model node loads its ``.mar`` from the model store with the spec's
``batch-size`` / ``max-batch-delay`` (its own model-config.yaml wins) and ``max-workers``
workers, each function node runs ``<handler file>:<function>`` in one worker, registration
waits for every node and is rolled back whole when one fails, and node models show in the
model API (function nodes are not listed) but never in snapshots. Ferry's differences:
registering and unregistering a workflow needs ``enable_model_api``, like models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from ferry.config.model_config import ModelConfig
from ferry.errors import (
    FerryError,
    InvalidRequest,
    WorkflowAlreadyExists,
    WorkflowNotFound,
    WorkflowRegistrationFailed,
)
from ferry.service import FerryService
from ferry.service.types import InputPart, PredictionRequest, page_of
from ferry.store.archive import ModelArchive
from ferry.store.manifest import Manifest
from ferry.store.remote import WORKFLOW_SUFFIXES, fetch_archive, is_remote
from ferry.workflows.executor import WorkflowAnswer, run_workflow
from ferry.workflows.functions import check_function_nodes, function_handler
from ferry.workflows.spec import ModelNode, WorkflowSpec, internal_name, load_spec
from ferry.workflows.war import WorkflowArchive, open_war

log = logging.getLogger("ferry.workflows")


@dataclass(frozen=True)
class WorkflowRequest:
    """``POST /workflows``: TorchServe's parameters."""

    url: str
    workflow_name: str | None = None
    response_timeout: float | None = None
    startup_timeout: float | None = None


@dataclass(frozen=True)
class RegisteredWorkflow:
    name: str
    url: str
    archive: WorkflowArchive
    spec: WorkflowSpec
    downloaded: Path | None
    """The .war fetched into the store for this registration (deleted with it)."""

    @property
    def node_models(self) -> list[str]:
        return [internal_name(self.name, node) for node in self.spec.topological_order()]


@dataclass(frozen=True)
class WorkflowPage:
    workflows: list[tuple[str, str]]
    """(workflow name, url it was registered from)."""
    next_page_token: str | None


class WorkflowManager:
    def __init__(self, service: FerryService) -> None:
        self.service = service
        self._workflows: dict[str, RegisteredWorkflow] = {}
        self._reserved: set[str] = set()
        """Names being registered right now: a second registration of one is a conflict."""

    # --- management ----------------------------------------------------------------------

    async def register(self, request: WorkflowRequest) -> str:
        """Register the workflow and load every node; returns its name."""
        self.service.require_model_api()
        store = self.service.settings.workflow_store or self.service.settings.model_store
        if store is None:
            raise InvalidRequest("no --workflow-store or --model-store is configured")
        relative, downloaded = request.url, None
        if is_remote(request.url):
            relative = await fetch_archive(
                request.url, store, self.service.settings.allowed_urls, WORKFLOW_SUFFIXES
            )
            downloaded = store / relative
        try:
            workflow = await self._open(store, relative, request, downloaded)
        except BaseException:
            if downloaded is not None:
                downloaded.unlink(missing_ok=True)
            raise
        self._workflows[workflow.name] = workflow
        log.info("workflow %s registered: nodes %s", workflow.name, ", ".join(workflow.spec.nodes))
        return workflow.name

    async def _open(
        self, store: Path, relative: str, request: WorkflowRequest, downloaded: Path | None
    ) -> RegisteredWorkflow:
        archive = await asyncio.to_thread(
            open_war,
            store,
            relative,
            self.service.models.work_dir,
            request.workflow_name,
            max_unpacked_size=self.service.settings.max_unpacked_size,
        )
        try:
            self._reserve(archive.name)
            try:
                spec = load_spec(archive.spec_path)
                check_function_nodes(spec, archive.handler_path)
                workflow = RegisteredWorkflow(archive.name, request.url, archive, spec, downloaded)
                await self._load_nodes(workflow, request)
            finally:
                self._reserved.discard(archive.name)
        except BaseException:
            archive.free()
            raise
        return workflow

    def _reserve(self, name: str) -> None:
        if name in self._workflows or name in self._reserved:
            raise WorkflowAlreadyExists(f"Workflow {name} is already registered.")
        self._reserved.add(name)

    async def _load_nodes(self, workflow: RegisteredWorkflow, request: WorkflowRequest) -> None:
        """Every node as a model, concurrently; if any fails, the others are removed and
        the registration fails with every node's reason."""
        nodes = workflow.spec.topological_order()
        outcomes = await asyncio.gather(
            *(self._load_node(workflow, node, request) for node in nodes),
            return_exceptions=True,
        )
        failures = [
            f"Workflow Node {internal_name(workflow.name, node)} failed to register. "
            f"Details: {outcome}"
            for node, outcome in zip(nodes, outcomes, strict=True)
            if isinstance(outcome, BaseException)
        ]
        if not failures:
            return
        for node, outcome in zip(nodes, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                with contextlib.suppress(FerryError):
                    await self.service.models.remove(internal_name(workflow.name, node))
        raise WorkflowRegistrationFailed(
            f"Workflow {workflow.name} has failed to register. Failures: [{', '.join(failures)}]"
        )

    async def _load_node(
        self, workflow: RegisteredWorkflow, node: str, request: WorkflowRequest
    ) -> None:
        settings = workflow.spec.node(node)
        name = internal_name(workflow.name, node)
        if settings.url is None:
            archive = self._function_archive(workflow, node, name)
        else:
            opened = await self.service.models.archives.open(settings.url, name)
            archive = replace(opened, workflow=workflow.name)
        archive = replace(archive, config=_node_config(archive.config, settings, request))
        await self.service.models.load_archive(archive, request.startup_timeout)

    @staticmethod
    def _function_archive(workflow: RegisteredWorkflow, node: str, name: str) -> ModelArchive:
        """A function node as a model: the handler file's function, from the .war's folder."""
        handler = function_handler(Path(workflow.archive.handler_path.name), node)
        document = {"model": {"modelName": name, "modelVersion": "1.0", "handler": handler}}
        manifest = Manifest(name, "1.0", handler, None, None, None, document)
        return ModelArchive(
            name=name,
            version="1.0",
            model_dir=workflow.archive.folder,
            manifest=manifest,
            config=ModelConfig(),
            source="",  # no archive of its own: not listed by GET /models
            workflow=workflow.name,
        )

    async def unregister(self, name: str) -> None:
        self.service.require_model_api()
        workflow = self._get(name)
        del self._workflows[name]
        failures = []
        for model in workflow.node_models:
            try:
                await self.service.models.remove(model)
            except FerryError as error:
                failures.append(f"{model}: {error}")
        await asyncio.to_thread(workflow.archive.free)
        if workflow.downloaded is not None:
            workflow.downloaded.unlink(missing_ok=True)
        if failures:
            log.error("workflow %s: nodes not unregistered: %s", name, "; ".join(failures))

    def describe(self, name: str) -> RegisteredWorkflow:
        return self._get(name)

    def page(self, limit: int, page_token: int) -> WorkflowPage:
        """A page of workflows by name, with the model API's paging rules."""
        page, token = page_of(sorted(self._workflows), limit, page_token)
        return WorkflowPage([(name, self._workflows[name].url) for name in page], token)

    def _get(self, name: str) -> RegisteredWorkflow:
        workflow = self._workflows.get(name)
        if workflow is None:
            raise WorkflowNotFound(f"Workflow not found: {name}")
        return workflow

    # --- inference -----------------------------------------------------------------------

    async def predict(
        self, name: str, parts: list[InputPart], headers: dict[str, str]
    ) -> WorkflowAnswer:
        workflow = self._get(name)

        async def predict_node(node: str, inputs: list[InputPart], sent: dict[str, str]) -> bytes:
            model = internal_name(workflow.name, node)
            admission = self.service.admit(model)
            answer = await self.service.predict(admission, PredictionRequest(inputs, sent))
            return answer.body

        # One trace across the nodes: each node's request is a child of the workflow's span.
        with self.service.tracing.span(f"workflow {name}", headers) as traced:
            return await run_workflow(workflow.spec, parts, traced, predict_node)

    async def close(self) -> None:
        """Free every workflow's unpacked files (the service stops the node models)."""
        for workflow in self._workflows.values():
            await asyncio.to_thread(workflow.archive.free)
        self._workflows.clear()


def _node_config(config: ModelConfig, node: ModelNode, request: WorkflowRequest) -> ModelConfig:
    """The spec's settings for a node, where the model's own model-config.yaml is silent
    (as TorchServe: a valid model-config value wins). TorchServe starts ``max-workers``
    workers per node."""
    return ModelConfig(
        **{
            **config.__dict__,
            "min_workers": config.min_workers or node.max_workers,
            "max_workers": config.max_workers or node.max_workers,
            "batch_size": config.batch_size or node.batch_size,
            "max_batch_delay_ms": config.max_batch_delay_ms
            if config.max_batch_delay_ms is not None
            else float(node.max_batch_delay_ms),
            "response_timeout": config.response_timeout or request.response_timeout,
        }
    )


def workflow_dag_text(spec: WorkflowSpec) -> str:
    """The DAG as TorchServe's describe prints it (a Java map): ``{pre=[m1], m1=[post]}``."""
    edges = (f"{node}=[{', '.join(children)}]" for node, children in spec.dag.items())
    return "{" + ", ".join(edges) + "}"
