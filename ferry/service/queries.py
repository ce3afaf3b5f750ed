"""What the management and metadata calls read from the registry: statuses, pages of
models, declared tensors, and the metrics exposition with its gauges read now."""

from __future__ import annotations

import logging

from ferry.handlers.builtin.formats import MODEL_FORMATS, ModelSource
from ferry.metrics.definitions import FerryMetrics
from ferry.metrics.gpu import read_gpus
from ferry.scheduling.registry import ModelRegistry
from ferry.service.status import ModelStatus, model_status
from ferry.service.types import ModelMetadata, ModelPage, TensorSpec, page_of

log = logging.getLogger("ferry.service")


def describe(registry: ModelRegistry, name: str, version: str | None) -> list[ModelStatus]:
    """One version (the default when None), or every version for ``all``."""
    entries = registry.versions_of(name) if version == "all" else [registry.get(name, version)]
    return [model_status(entry) for entry in entries]


def all_statuses(registry: ModelRegistry) -> list[ModelStatus]:
    """Every registered version, by model name (the start-up summary)."""
    return [model_status(entry) for entry in registry.all_versions()]


def list_models(registry: ModelRegistry, limit: int, page_token: int) -> ModelPage:
    """A page of models (default versions), TorchServe's paging rules."""
    # Function nodes of workflows have no archive to name; TorchServe leaves them out.
    names = [name for name in registry.names() if registry.get(name).archive.source]
    page, token = page_of(names, limit, page_token)
    models = [(name, registry.get(name).archive.source) for name in page]
    return ModelPage(models, token)


def metadata(registry: ModelRegistry, name: str, version: str | None) -> ModelMetadata:
    """The model's declared tensors (model-config.yaml ``tensor_metadata``: ``inputs``
    and ``outputs``, each a list of ``{name, datatype, shape}``; none when absent), and
    the platform of its format (``ferry.handlers.builtin.formats``)."""
    entry = registry.get(name, version)
    archive = entry.archive
    declared = archive.config.raw.get("tensor_metadata") or {}
    manifest = archive.manifest
    source = ModelSource(
        archive.model_dir, manifest.serialized_file, manifest.model_file, archive.config.raw
    )
    return ModelMetadata(
        name=archive.name,
        versions=[v.archive.version for v in registry.versions_of(name)],
        platform=MODEL_FORMATS.platform_of(source),
        inputs=_tensor_specs(declared, "inputs", name),
        outputs=_tensor_specs(declared, "outputs", name),
    )


def _tensor_specs(declared: object, key: str, model: str) -> list[TensorSpec]:
    entries = declared.get(key, []) if isinstance(declared, dict) else []
    specs = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            shape = entry.get("shape", [])
            specs.append(
                TensorSpec(
                    entry["name"],
                    str(entry.get("datatype", "BYTES")),
                    [int(d) for d in shape] if isinstance(shape, list) else [],
                )
            )
        else:
            log.warning("model %s: tensor_metadata.%s entry %r ignored", model, key, entry)
    return specs


def metrics_exposition(registry: ModelRegistry, metrics: FerryMetrics, gpus: int) -> str:
    """Prometheus text, with the gauges (queues, worker states and processes, the host,
    and the GPUs when there are any) read now."""
    workers: dict[int, str] = {}
    for entry in registry.all_versions():
        runner = entry.runner
        states: dict[str, int] = {}
        for slot in runner.slots:
            states[slot.state.value] = states.get(slot.state.value, 0) + 1
            info = slot.worker.info if slot.worker is not None else None
            if info is not None and info.pid is not None:
                # A process its models share is one process: named once, by its group.
                group = runner.settings.process_group
                label = f"{runner.name}/{runner.version}/w{slot.index}"
                workers[info.pid] = f"group {group} pid {info.pid}" if info.shared else label
        runner.metrics.set_queue_and_workers(runner.waiting, states)
        runner.metrics.set_residency(runner.resident(), runner.footprint())
    metrics.record_processes((label, pid) for pid, label in workers.items())
    metrics.record_host()
    if gpus:
        metrics.record_gpus(read_gpus())
    return metrics.exposition()
