"""``BaseHandler``: TorchServe's default flow, initialize → preprocess → inference → postprocess.

After ``initialize`` a handler has TorchServe's attributes: ``context``, ``manifest``,
``model_dir``, ``model_yaml_config``, ``device``, ``map_location`` (``"cuda"`` or
``"cpu"``), ``model_pt_path`` (the serialized file, or None), ``model``, ``mapping``
(``index_to_name.json``) and ``initialized``; and its helpers ``_load_pickled_model``,
``_load_torchscript_model`` (which ``initialize`` calls, so a subclass may replace them),
``get_device``, ``describe_handle``, ``explain_handle`` and ``_is_explain``.

TorchServe's handlers often skip ``super().__init__()`` (its micro-batching example does),
or ``super().initialize()``, or both. So every attribute the built-in handlers read has a
class-level default, and ``initialize`` sets the rest itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ferry.config.sections import torchserve_compile_options
from ferry.errors import ArchiveError
from ferry.handlers.builtin.device import DevicePath, HostPath, Transform, device_path_for
from ferry.handlers.builtin.formats import (
    AOT_COMPILED,
    EAGER,
    MODEL_FORMATS,
    TORCHSCRIPT,
    ModelFormat,
    ModelSource,
    load_model,
)
from ferry.handlers.builtin.model_loading import (
    load_aot_compiled,
    load_eager_model,
    load_label_mapping,
    select_device,
)
from ferry.handlers.builtin.optimize import (
    Optimizations,
    begin_graph_tree_step,
    copy_graph_tree_outputs,
    finish_output,
    graph_model,
    optimize_model,
    prepare_input,
    warm_up,
)
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.exceptions import PredictionException
from ferry.handlers.torchserve.ts_utils import check_valid_pt2_backend

log = logging.getLogger("ferry.handlers")


class BaseHandler:
    """Subclass it and override the stages you need; ``handle`` runs them in order."""

    # What ``__init__`` sets, readable where a subclass's ``__init__`` skipped it.
    model: Any = None
    mapping: dict[str, str] | None = None
    device: torch.device | None = None
    initialized = False
    context: Context | None = None
    manifest: dict[str, Any] | None = None
    map_location: str | None = None
    model_pt_path: str | None = None
    model_dir: str | None = None
    explain = False
    target = 0
    optimizations = Optimizations()
    _device_path: DevicePath | None = None

    def __init__(self) -> None:
        self.model = None
        self.mapping = None
        self.device = None
        self.initialized = False
        self.context = None
        self.manifest = None
        self.map_location = None
        self.model_pt_path = None
        self.model_dir = None
        self.model_yaml_config: dict[str, Any] = {}
        self.explain = False
        self.target = 0
        self.profiler_args: dict[str, Any] = {}
        self.optimizations = Optimizations()
        self._device_path = HostPath()

    def initialize(self, context: Context) -> None:
        """Pick the device, load the model from the manifest and ``index_to_name.json``.

        Sets every attribute itself, so a subclass whose ``__init__`` skips
        ``super().__init__()`` (as TorchServe's examples sometimes do) still works. An eager
        model is loaded through ``self._load_pickled_model``, a TorchScript one through
        ``self._load_torchscript_model``, as TorchServe does, so overrides of those apply
        (and may change ``self.device``, which the model then moves to)."""
        self.context = context
        self.explain, self.target = False, 0
        properties = context.system_properties
        self.model_dir = str(properties["model_dir"])
        self.model_yaml_config = context.model_yaml_config
        self.model_pt_path = None
        self.device = select_device(properties.get("gpu_id"))
        self.map_location = self.device.type
        self.manifest = context.manifest
        model_dir = Path(properties["model_dir"])
        model_section = self.manifest.get("model", {})
        serialized = model_section.get("serializedFile")
        if serialized:
            self.model_pt_path = str(model_dir / serialized)
        self.model = self._load_model(model_dir, serialized, model_section.get("modelFile"))
        device = self._device()  # an override may have moved the handler
        self._device_path = device_path_for(device)
        self.optimizations = Optimizations.from_model_config(context.model_yaml_config)
        if self.model is not None:
            self.model = optimize_model(self.model, self.optimizations, device)
            self.model = _torchserve_compiled(
                self.model, self.model_yaml_config, self.optimizations
            )
            self.model = graph_model(self.model, self.optimizations, device)
            warm_up(self.model, self.optimizations, device)
        self.mapping = load_label_mapping(model_dir / "index_to_name.json")
        self.initialized = True

    def _load_model(self, model_dir: Path, serialized: str | None, model_file: str | None) -> Any:
        """The manifest's model, in eval mode on the handler's device, in the format
        ``MODEL_FORMATS`` tells; those TorchServe's ``BaseHandler`` loads through a helper
        go through that helper, which a subclass may override."""
        config = getattr(self, "model_yaml_config", None) or {}
        source = ModelSource(model_dir, serialized, model_file, config)
        model_format = MODEL_FORMATS.detect(source)
        if model_format is None:
            return None
        helper = _TORCHSERVE_HELPERS.get(model_format)
        if helper is not None:
            return helper(self, source)
        return model_format.load(source, self._device())

    def __getstate__(self) -> dict[str, Any]:
        """A copy for a preprocess process: no model, no per-batch context, on the CPU."""
        state = dict(self.__dict__)
        state.update(model=None, context=None, device=torch.device("cpu"), _device_path=HostPath())
        state.pop("handle", None)  # a ``MicroBatching`` entry point stays in the worker
        return state

    # TorchServe handlers often call these two directly from their own initialize().
    def _load_torchscript_model(self, model_pt_path: str) -> Any:
        """The TorchScript file, in eval mode on ``self.device``."""
        path = Path(model_pt_path)
        if not path.is_file():
            raise ArchiveError(f"serialized file {path.name!r} not found in the archive")
        return load_model(path.parent, path.name, None, self._device())

    def _load_torch_export_aot_compile(self, model_so_path: str) -> Any:
        """TorchServe's earlier AOTInductor form: a shared library from
        ``torch._export.aot_compile``, named by model-config.yaml's ``pt2: {export:
        {aot_compile: true}}``, on ``self.device`` (an AOTInductor package, ``.pt2``, is
        the current form)."""
        return load_aot_compiled(Path(model_so_path), self._device())

    def _load_pickled_model(
        self, model_dir: str, model_file: str, model_pt_path: str | None
    ) -> Any:
        """An eager model: the one ``nn.Module`` class of ``model_file`` (in ``model_dir``),
        instantiated, its state dict loaded from ``model_pt_path`` when there is one, in
        eval mode on ``self.device``."""
        weights = Path(model_pt_path) if model_pt_path else None
        model = load_eager_model(Path(model_dir) / model_file, weights, self._device())
        return _on_device_for_inference(model, self._device())

    def get_device(self) -> torch.device | None:
        """``self.device``, as TorchServe's ``BaseHandler.get_device``."""
        return self.device

    def _device(self) -> torch.device:
        """``self.device`` as a ``torch.device`` (a handler may set it to a string such as
        ``"cpu"``); the CPU while there is none."""
        device = getattr(self, "device", None)
        if device is None:
            return torch.device("cpu")
        return device if isinstance(device, torch.device) else torch.device(device)

    @property
    def device_path(self) -> DevicePath:
        """Uploads and inference stream for ``self.device`` (which TorchServe handlers may
        set in their own ``initialize``)."""
        device = self._device()
        path = getattr(self, "_device_path", None)
        if path is None or path.device != device:
            path = self._device_path = device_path_for(device)
        return path

    def to_device(self, batch: torch.Tensor, then: Transform | None = None) -> torch.Tensor:
        """A preprocessed batch on the model's device (pinned, non-blocking on a GPU), with
        ``then`` applied there."""
        return self.device_path.upload(batch, then)

    def preprocess(self, data: list[dict[str, Any]]) -> Any:
        return self.to_device(torch.as_tensor(data))

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """The model on the batch: cast, laid out and padded to its bucket as configured;
        padded rows are dropped from the output. On a GPU it runs on the worker's compute
        stream."""
        with self.device_path.compute():
            if not isinstance(data, torch.Tensor):
                with torch.inference_mode():
                    begin_graph_tree_step(self.optimizations)
                    answer = self.model(data, *args, **kwargs)
                    return copy_graph_tree_outputs(answer, self.optimizations)
            # Padded or not, the model gets an ordinary tensor, as preprocess and warm-up
            # make them: compiled graphs' guards tell it from an inference tensor.
            batch, rows = prepare_input(data, self.optimizations, self._device())
            with torch.inference_mode():
                begin_graph_tree_step(self.optimizations)
                output = self.model(batch, *args, **kwargs)
                return finish_output(output, rows, batch.shape[0], self.optimizations)

    def postprocess(self, data: Any) -> list[Any]:
        result: list[Any] = data.tolist()
        return result

    def handle(self, data: list[dict[str, Any]], context: Context) -> list[Any]:
        """The three stages in order (or ``explain_handle`` when the batch asks for
        explanations); records ``HandlerTime`` in ms, as TorchServe does."""
        self.context = context
        if self._is_describe():
            return [self.describe_handle()]
        start = time.perf_counter()
        batch = timed_stage(context, "preprocess", self.preprocess, data)
        if self._is_explain():
            result: list[Any] = self.explain_handle(batch, data)
        else:
            output = timed_stage(context, "inference", self.inference, batch)
            result = timed_stage(context, "postprocess", self.postprocess, output)
        elapsed_ms = round((time.perf_counter() - start) * 1000, 2)
        context.metrics.add_time("HandlerTime", elapsed_ms, None, "ms")
        return result

    def describe_handle(self) -> Any:
        """Extra model metadata for the describe API; None by default."""
        return None

    def _is_describe(self) -> bool:
        """Whether this is the describe API's request (``GET /models/NAME?customized=true``):
        it carries the header ``describe: True`` and no input."""
        context = getattr(self, "context", None)
        if context is None or not context.request_processor:
            return False
        header = context.get_request_header(0, "describe")
        return header is not None and header.lower() == "true"

    def _is_explain(self) -> bool:
        """Whether the batch asks for explanations: its first request's ``explain`` header
        is ``true`` (the header TorchServe's explanations API sets)."""
        context = getattr(self, "context", None)
        if context is None or not context.request_processor:
            return False
        header = context.get_request_header(0, "explain")
        self.explain = header is not None and header.lower() == "true"
        return self.explain

    def explain_handle(self, data_preprocess: Any, raw_data: list[dict[str, Any]]) -> Any:
        """``self.get_insights(data_preprocess, inputs, target)``, where ``inputs`` and
        ``target`` come from the first request (its ``data`` or ``body``, its ``target``,
        default 0). A handler without ``get_insights`` cannot explain: that answers 501."""
        get_insights = getattr(self, "get_insights", None)
        if get_insights is None:
            raise PredictionException(
                f"{type(self).__name__} does not explain its predictions (no get_insights)", 501
            )
        row = raw_data[0] if raw_data else {}
        inputs = row.get("data") or row.get("body") if isinstance(row, dict) else None
        target = (row.get("target") if isinstance(row, dict) else None) or 0
        self.target = target
        return get_insights(data_preprocess, inputs, target)


def _on_device_for_inference(model: Any, device: torch.device | None) -> Any:
    """``model`` moved to ``device`` (if given) and in eval mode, where it can be: a loader
    override may return any object."""
    if device is not None and callable(getattr(model, "to", None)):
        moved = model.to(device)
        model = moved if moved is not None else model
    if callable(getattr(model, "eval", None)) and not isinstance(model, torch.fx.GraphModule):
        model.eval()
    return model


def timed_stage(context: Context, stage: str, function: Any, argument: Any) -> Any:
    """Run one handler stage and add its time (and when it began) to the context."""
    started_ns, start = time.time_ns(), time.perf_counter()
    try:
        return function(argument)
    finally:
        context.add_stage_time(stage, (time.perf_counter() - start) * 1000, started_ns)


def _through_pickled_model(handler: BaseHandler, source: ModelSource) -> Any:
    model = handler._load_pickled_model(
        str(source.model_dir), str(source.model_file), handler.model_pt_path
    )
    return _on_device_for_inference(model, handler._device())


def _through_torchscript_model(handler: BaseHandler, source: ModelSource) -> Any:
    model = handler._load_torchscript_model(str(source.serialized_path))
    return _on_device_for_inference(model, None)


def _through_aot_compile(handler: BaseHandler, source: ModelSource) -> Any:
    return handler._load_torch_export_aot_compile(str(source.serialized_path))


_TORCHSERVE_HELPERS: dict[ModelFormat, Callable[[BaseHandler, ModelSource], Any]] = {
    EAGER: _through_pickled_model,
    TORCHSCRIPT: _through_torchscript_model,
    AOT_COMPILED: _through_aot_compile,
}
"""The formats TorchServe's ``BaseHandler`` loads through a helper a subclass may override
(``_load_pickled_model``, ``_load_torchscript_model``, ``_load_torch_export_aot_compile``);
the other formats load as ``MODEL_FORMATS`` says."""


def _torchserve_compiled(model: Any, config: dict[str, Any], options: Optimizations) -> Any:
    """``model`` compiled as TorchServe's ``pt2`` asks (not when Ferry's own ``optimization:
    compile`` is set); as in TorchServe, an unknown backend or a failing compile leaves the
    model as it was, with a warning."""
    compile_options = torchserve_compile_options(config)
    if compile_options is None or options.compile_mode is not None:
        return model
    backend = compile_options.get("backend")
    if backend is not None and not check_valid_pt2_backend(backend):
        return model
    try:
        compiled = torch.compile(model, **compile_options)
    except Exception as error:  # torch.compile's options are free-form: any may be wrong
        log.warning(
            "pt2: compiling with %s failed (%s); the model runs as it is", compile_options, error
        )
        return model
    log.info("pt2: compiled with %s", compile_options)
    return compiled
