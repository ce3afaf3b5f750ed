"""TorchServe's DALI handlers: images decoded and transformed by an NVIDIA DALI pipeline
(``ts.torch_handler.dali_handler``, ``dali_image_classifier``,
``ts.handler_utils.preprocess.dali``).

They run in Ferry where DALI is installed in the worker's Python (NVIDIA's
``nvidia-dali-cudaNNN`` packages); without it the load fails saying so. The pipeline is
the serialized one model-config.yaml's ``dali`` section names::

    dali:
      batch_size: 5        # at least the model's batchSize
      num_threads: 2
      device_id: 0
      seed: 12
      pipeline_file: model.dali   # in the archive (Pipeline.serialize)

TorchServe falls back to a ``default.dali`` it ships when ``pipeline_file`` is absent;
Ferry ships none, and says so at load.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.image_classifier import TopClasses
from ferry.handlers.builtin.insights import IntegratedGradients
from ferry.handlers.contract.context import Context
from ferry.handlers.torchserve.unsupported import NotSupportedByFerry

PIPELINE_KEYS = ("batch_size", "num_threads", "device_id", "seed")
"""What the ``dali`` section must set."""


def _dali_pipeline_class() -> Any:
    try:
        return importlib.import_module("nvidia.dali.pipeline").Pipeline
    except ImportError as exc:
        raise ImportError(
            "the DALI handler needs NVIDIA DALI (nvidia.dali), which is not installed in "
            "the worker's Python: pip install nvidia-dali-cuda120 (or the build for your "
            "CUDA) from NVIDIA's package index where Ferry runs"
        ) from exc


def get_dali_pipeline(ctx: Context) -> Any:
    """The DALI pipeline model-config.yaml's ``dali`` section describes, deserialized."""
    section = ctx.model_yaml_config.get("dali")
    if not isinstance(section, dict):
        raise ValueError(f"{ctx.model_name} has no dali config in model config yaml file")
    missing = [key for key in PIPELINE_KEYS if key not in section]
    if missing:
        raise ValueError(f"model-config.yaml's dali section lacks {', '.join(missing)}")
    pipeline_file = section.get("pipeline_file")
    if not pipeline_file:
        raise NotSupportedByFerry(
            "TorchServe's built-in default.dali pipeline is not shipped with Ferry: "
            "serialize your pipeline (Pipeline.serialize) into the archive and name it in "
            "model-config.yaml's dali.pipeline_file"
        )
    path = Path(str(ctx.system_properties["model_dir"])) / str(pipeline_file)
    if not path.is_file():
        raise RuntimeError(f"Missing dali pipeline file {pipeline_file!r} in the model folder")
    settings = {key: section[key] for key in PIPELINE_KEYS}
    pipeline = _dali_pipeline_class().deserialize(
        filename=str(path), prefetch_queue_depth=1, **settings
    )
    # As TorchServe does: deserialize may keep the values the file was saved with.
    pipeline._max_batch_size = settings["batch_size"]
    pipeline._num_threads = settings["num_threads"]
    pipeline._device_id = settings["device_id"]
    return pipeline


class DALIHandler(BaseHandler):
    """``BaseHandler`` whose ``preprocess`` runs the requests' bytes through the DALI
    pipeline (``self.pipeline``): one tensor per request, stacked, on ``self.device``."""

    pipeline: Any = None
    _insights: IntegratedGradients | None = None

    def initialize(self, context: Context) -> None:
        self.pipeline = get_dali_pipeline(context)  # first: it fails before weights load
        super().initialize(context)

    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        images = []
        for row in data:
            image = row.get("data") or row.get("body")
            if isinstance(image, bytes | bytearray):
                image = np.frombuffer(image, dtype=np.uint8)
            images.append(image)
        outputs = self.pipeline.run(source=images)[0]
        if hasattr(outputs, "as_cpu"):  # a GPU TensorList: copied out, then to self.device
            outputs = outputs.as_cpu()
        tensors = [torch.as_tensor(np.asarray(outputs.at(i))) for i in range(len(outputs))]
        return torch.stack(tensors).to(self._device())

    def get_insights(self, tensor_data: torch.Tensor, _: Any, target: int = 0) -> list[Any]:
        """Integrated Gradients attributions to class ``target`` (needs captum)."""
        if self._insights is None:
            self._insights = IntegratedGradients(self.model)
        return self._insights.attribute(tensor_data, int(target))


class DALIImageClassifier(TopClasses, DALIHandler):
    """The ``dali_image_classifier`` handler: DALI's preprocessing, then the top
    ``topk`` classes' probabilities as ``{label: p}``."""
