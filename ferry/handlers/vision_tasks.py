"""Built-in ``image_segmenter``, ``object_detector`` and ``image_embedder`` handlers, with
TorchServe's output shapes where TorchServe has the handler.

- ``image_segmenter``: per image, the class index of every pixel (a list of rows).
- ``object_detector``: per image, ``[{label: [x1, y1, x2, y2], "score": s}, ...]``. The model
  returns per image ``{"boxes", "labels", "scores"}`` (torchvision's convention) or one
  ``(N, 6)`` tensor of ``x1, y1, x2, y2, score, label`` candidates; class-wise NMS runs in
  plain torch unless torchvision is importable. model-config.yaml ``object_detector:``
  ``score_threshold`` (0.5), ``iou_threshold`` (0.5).
- ``image_embedder``: per image, the embedding vector (L2-normalised unless
  ``image_embedder: {normalize: false}``).

Each reads ``resize``, ``crop``, ``mean``, ``std`` and ``gpu_decode`` from its own
model-config.yaml section (named as the handler); boxes and masks are in the cropped input's
pixels.
"""

from __future__ import annotations

from typing import Any

import torch

from ferry.config.sections import ImageEmbedderConfig, ObjectDetectorConfig, read_section
from ferry.handlers.context import Context
from ferry.handlers.image_classifier import VisionHandler
from ferry.handlers.nms import batched_nms


class ImageSegmenter(VisionHandler):
    config_section = "image_segmenter"

    def postprocess(self, data: Any) -> list[Any]:
        scores = data["out"] if isinstance(data, dict) else data
        maps: list[Any] = scores.argmax(1).tolist()
        return maps


class ObjectDetector(VisionHandler):
    config_section = "object_detector"
    score_threshold = 0.5
    iou_threshold = 0.5

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        section = context.model_yaml_config.get("object_detector")
        settings = read_section(ObjectDetectorConfig, section, "object_detector")
        self.score_threshold = settings.score_threshold
        self.iou_threshold = settings.iou_threshold

    def _detections(
        self, boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor
    ) -> list[dict[str, Any]]:
        confident = scores >= self.score_threshold
        boxes, scores, labels = boxes[confident], scores[confident], labels[confident]
        kept = batched_nms(boxes.float(), scores.float(), labels, self.iou_threshold)
        results = []
        for index in kept.tolist():
            label = str(int(labels[index]))
            name = self.mapping.get(label, label) if self.mapping else label
            results.append(
                {
                    name: [round(v, 2) for v in boxes[index].tolist()],
                    "score": round(float(scores[index]), 4),
                }
            )
        return results

    def postprocess(self, data: Any) -> list[list[dict[str, Any]]]:
        if isinstance(data, torch.Tensor):  # (batch, N, 6) candidates
            return [self._detections(row[:, :4], row[:, 4], row[:, 5].long()) for row in data]
        return [self._detections(d["boxes"], d["scores"], d["labels"].long()) for d in data]


class ImageEmbedder(VisionHandler):
    config_section = "image_embedder"
    normalize = True

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        section = context.model_yaml_config.get("image_embedder")
        self.normalize = read_section(ImageEmbedderConfig, section, "image_embedder").normalize

    def postprocess(self, data: Any) -> list[list[float]]:
        vectors = data.flatten(1).float()
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=1)
        result: list[list[float]] = vectors.tolist()
        return result
