"""``BaseHandler``: TorchServe's default flow, initialize → preprocess → inference → postprocess.

After ``initialize`` a handler has TorchServe's attributes: ``context``, ``manifest``,
``model_dir``, ``model_yaml_config``, ``device``, ``map_location`` (``"cuda"`` or
``"cpu"``), ``model_pt_path`` (the serialized file, or None), ``model``, ``mapping``
(``index_to_name.json``) and ``initialized``; and its helpers ``_load_pickled_model``,
``_load_torchscript_model``, ``describe_handle``, ``explain_handle`` and ``_is_explain``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ferry.handlers.builtin.device import DevicePath, HostPath, Transform, device_path_for
from ferry.handlers.builtin.model_loading import load_label_mapping, load_model, select_device
from ferry.handlers.builtin.optimize import (
    Optimizations,
    finish_output,
    graph_model,
    optimize_model,
    prepare_input,
    warm_up,
)
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.exceptions import PredictionException


class BaseHandler:
    """Subclass it and override the stages you need; ``handle`` runs them in order."""

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: torch.device | None = None
        self.initialized = False
        self.context: Context | None = None
        self.manifest: dict[str, Any] | None = None
        self.map_location: str | None = None
        self.model_pt_path: str | None = None
        self.model_dir: str | None = None
        self.model_yaml_config: dict[str, Any] = {}
        self.explain = False
        self.target = 0
        self.optimizations = Optimizations()
        self._device_path: DevicePath = HostPath()

    def initialize(self, context: Context) -> None:
        """Pick the device, load the model from the manifest and ``index_to_name.json``.

        Sets every attribute itself, so a subclass whose ``__init__`` skips
        ``super().__init__()`` (as TorchServe's examples sometimes do) still works."""
        self.context = context
        self.explain, self.target = False, 0
        properties = context.system_properties
        self.model_dir = str(properties["model_dir"])
        self.model_yaml_config = context.model_yaml_config
        self.model_pt_path = None
        self.device = select_device(properties.get("gpu_id"))
        self._device_path = device_path_for(self.device)
        self.map_location = self.device.type
        self.manifest = context.manifest
        model_dir = Path(properties["model_dir"])
        model_section = self.manifest.get("model", {})
        serialized = model_section.get("serializedFile")
        if serialized:
            self.model_pt_path = str(model_dir / serialized)
        self.model = load_model(model_dir, serialized, model_section.get("modelFile"), self.device)
        self.optimizations = Optimizations.from_model_config(context.model_yaml_config)
        if self.model is not None:
            self.model = optimize_model(self.model, self.optimizations, self.device)
            self.model = graph_model(self.model, self.optimizations, self.device)
            warm_up(self.model, self.optimizations, self.device)
        self.mapping = load_label_mapping(model_dir / "index_to_name.json")
        self.initialized = True

    def __getstate__(self) -> dict[str, Any]:
        """A copy for a preprocess process: no model, no per-batch context, on the CPU."""
        state = dict(self.__dict__)
        state.update(model=None, context=None, device=torch.device("cpu"), _device_path=HostPath())
        return state

    # TorchServe handlers often call these two directly from their own initialize().
    def _load_torchscript_model(self, model_pt_path: str) -> Any:
        """The TorchScript file, in eval mode on ``self.device``."""
        return load_model(
            Path(model_pt_path).parent, Path(model_pt_path).name, None, self._device()
        )

    def _load_pickled_model(self, model_dir: str, model_file: str, model_pt_path: str) -> Any:
        """An eager model: the one ``nn.Module`` class of ``model_file`` (in ``model_dir``),
        instantiated, its state dict loaded from ``model_pt_path``, in eval mode on
        ``self.device``."""
        weights = Path(model_pt_path)
        if weights.parent != Path(model_dir):
            raise ValueError("the weights must be in the model folder")
        return load_model(Path(model_dir), weights.name, model_file, self._device())

    def _device(self) -> torch.device:
        device = getattr(self, "device", None)
        return device if device is not None else torch.device("cpu")

    @property
    def device_path(self) -> DevicePath:
        """Uploads and inference stream for ``self.device`` (which TorchServe handlers may
        set in their own ``initialize``)."""
        if getattr(self, "_device_path", None) is None:
            self._device_path = HostPath()
        if self._device_path.device != self._device():
            self._device_path = device_path_for(self._device())
        return self._device_path

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
        with torch.inference_mode(), self.device_path.compute():
            if not isinstance(data, torch.Tensor):
                return self.model(data, *args, **kwargs)
            batch, rows = prepare_input(data, self.optimizations, self._device())
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


def timed_stage(context: Context, stage: str, function: Any, argument: Any) -> Any:
    """Run one handler stage and add its time to ``context.stage_ms``."""
    start = time.perf_counter()
    try:
        return function(argument)
    finally:
        context.add_stage_time(stage, (time.perf_counter() - start) * 1000)
