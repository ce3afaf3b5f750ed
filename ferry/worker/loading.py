"""Load a model's handler as a worker runs it: the one loader that the worker process,
``ferry bench profile`` and the benchmark scripts share.

It puts the model folder first on ``sys.path`` (handlers import their own files) and
TorchServe's ``ts`` shim last (only when no real ``ts`` is importable), builds the
``Context``, resolves and initialises the entry point by TorchServe's rules
(``ferry.handlers.contract.loader``) and, when model-config.yaml asks for ``micro_batching``, wraps
it in the stage pipeline.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.config.sections import shares_weights
from ferry.handlers.builtin.shared_weights import sharing_weights
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.loader import EntryPoint, load_entry_point
from ferry.handlers.torchserve import request_envelope
from ferry.wire.spec import HandlerSpec
from ferry.worker.compile_cache import model_compile_cache
from ferry.worker.pipeline import PipelineSettings, StagePipeline, staged_handler

log = logging.getLogger("ferry.worker")

SHIM_ROOT = Path(__file__).resolve().parent.parent / "_compat"
"""The folder of the ``ts`` shims (``ferry._compat``), put on ``sys.path`` in workers: a
folder, not imported here, since the shims import the worker's ``micro_batching``."""


@dataclass
class ReadyHandler:
    """A handler loaded and initialised in this process."""

    entry: EntryPoint
    """What to call per batch, ``entry(rows, context)``: the stage pipeline when configured."""
    context: Context
    instance: Any | None
    """The handler object for class-based handlers (its ``preprocess``, ``model`` ...);
    None for function handlers."""
    pipeline: StagePipeline | None = None
    request_envelopes: Callable[[str], EntryPoint] | None = None
    """The entry point for each request envelope a request names (``RequestItem.envelope``):
    only for TorchServe's handlers (``reads_envelopes``) where no ``service_envelope``
    wraps ``entry`` for every request; None, every request goes to ``entry``."""

    def close(self) -> None:
        """Stop the stage pipeline's threads and processes, if any."""
        if self.pipeline is not None:
            self.pipeline.close()


def prepare_imports(model_dir: str, package_dirs: Sequence[str] = ()) -> None:
    """The model folder first on ``sys.path``, then its own packages (ahead of the
    server's); the ``ts`` shim last, if no ``ts`` exists."""
    for path in (model_dir, *package_dirs):
        if path in sys.path:
            sys.path.remove(path)
    sys.path[0:0] = [model_dir, *package_dirs]
    if importlib.util.find_spec("ts") is None:
        sys.path.append(str(SHIM_ROOT))


def load_handler(spec: HandlerSpec, *, gpu_id: int | None) -> ReadyHandler:
    """Import, instantiate and initialise the handler ``spec`` names (the manifest's
    handler string), with the ``Context`` TorchServe's handlers expect built from it.
    ``gpu_id`` is the GPU as this process sees it (``WorkerSpec.gpu_id`` is the server's
    index: a worker bound to its GPU sees it as 0, ``ferry.wire.environment.handler_gpu``)."""
    prepare_imports(spec.model_dir, spec.package_dirs)
    context = _handler_context(spec, gpu_id)
    config, cache = spec.model_yaml_config, spec.compile_cache
    shared = Path(cache) if cache and shares_weights(config) else None
    with model_compile_cache(cache, gpu_id, config), sharing_weights(shared):
        entry = load_entry_point(spec.handler, context)
    ready = ReadyHandler(entry, context, getattr(entry, "__self__", None))
    _add_pipeline(ready, config)
    if not spec.envelope and reads_envelopes(ready.instance):
        ready.request_envelopes = request_envelope.PerRequestEnvelopes(ready.entry)
    # Outermost, as TorchServe wraps the handler's entry point in it.
    ready.entry = request_envelope.wrap(ready.entry, spec.envelope)
    return ready


def _handler_context(spec: HandlerSpec, gpu_id: int | None) -> Context:
    """The ``Context`` TorchServe's handlers are initialised with, on GPU ``gpu_id`` as
    this process sees it."""
    return Context(
        spec.model_name,
        spec.model_dir,
        spec.manifest,
        spec.batch_size,
        gpu_id,
        model_yaml_config=spec.model_yaml_config,
        image_limits=spec.image_limits,
        model_metrics=spec.model_metrics,
    )


_TORCHSERVE_BASES = ("ferry.handlers.builtin.base_handler", "ts.torch_handler.base_handler")
"""Where TorchServe's ``BaseHandler`` lives: Ferry's (the ``ts`` shim's too), TorchServe's."""


def reads_envelopes(instance: Any) -> bool:
    """Whether a handler reads KServe's protocols only through their request envelopes:
    one built on TorchServe's ``BaseHandler`` (every built-in handler, and handlers
    written for TorchServe) takes rows of inputs, and on KServe TorchServe only ever hands
    it an envelope's. Other handlers (functions, classes of their own) get each protocol's
    document as it is, and may speak it themselves. Nothing is imported to tell."""
    for module in _TORCHSERVE_BASES:
        base = getattr(sys.modules.get(module), "BaseHandler", None)
        if isinstance(base, type) and isinstance(instance, base):
            return True
    return False


def _add_pipeline(ready: ReadyHandler, model_yaml_config: dict[str, Any]) -> None:
    """The stage pipeline around the handler, when model-config.yaml asks for one."""
    settings = PipelineSettings.from_model_config(model_yaml_config)
    if settings is None:
        return
    staged = staged_handler(ready.entry)
    if staged is None:
        log.warning("micro_batching ignored: the handler has no preprocess/inference/postprocess")
        return
    log.info("stage pipeline on: %s", settings)
    ready.pipeline = StagePipeline(staged, settings)
    ready.entry = ready.pipeline.handle
