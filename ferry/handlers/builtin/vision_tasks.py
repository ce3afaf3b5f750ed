"""Built-in ``image_segmenter``, ``object_detector`` and ``image_embedder`` handlers, with
TorchServe's output shapes where TorchServe has the handler.

- ``image_segmenter``: per image, per pixel ``[class index, probability]`` of the most likely
  class (a list of rows, as TorchServe's ``ImageSegmenter``; the index is a float there too).
- ``object_detector``: fed as TorchServe feeds it, each full image as a [0, 1] float tensor
  (``image_processing = ImageToTensor()``; stacked when all are the same size, else a list),
  so boxes are in the original image's pixels. Per image ``[{label: [x1, y1, x2, y2],
  "score": s}, ...]`` for scores of at least ``score_threshold`` (0.5). The model returns per
  image ``{"boxes", "labels", "scores"}`` (torchvision's convention, used as given) or one
  ``(N, 6)`` tensor of ``x1, y1, x2, y2, score, label`` candidates, which go through
  class-wise NMS (``iou_threshold``, 0.5) in plain torch unless torchvision is importable.
- ``image_embedder``: per image, the embedding vector (L2-normalised unless
  ``image_embedder: {normalize: false}``).

The segmenter and embedder read ``resize``, ``crop``, ``mean``, ``std`` and ``gpu_decode``
from their own model-config.yaml section (named as the handler); masks are in the cropped
input's pixels. The detector ignores those keys, as TorchServe's does.
"""

from __future__ import annotations

from typing import Any

import torch

from ferry.config.sections import ImageEmbedderConfig, ObjectDetectorConfig, read_section
from ferry.handlers.builtin.image_classifier import VisionHandler
from ferry.handlers.builtin.nms import batched_nms
from ferry.handlers.builtin.vision import ImageToTensor
from ferry.handlers.contract.context import Context


class ImageSegmenter(VisionHandler):
    config_section = "image_segmenter"

    def postprocess(self, data: Any) -> list[Any]:
        scores = data["out"] if isinstance(data, dict) else data
        best = torch.softmax(scores.float(), dim=1).max(dim=1)
        pairs = torch.stack([best.indices.to(best.values.dtype), best.values], dim=3)
        result: list[Any] = pairs.tolist()
        return result


class ObjectDetector(VisionHandler):
    config_section = "object_detector"
    image_processing = ImageToTensor()
    score_threshold = 0.5
    iou_threshold = 0.5

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        section = context.model_yaml_config.get("object_detector")
        settings = read_section(ObjectDetectorConfig, section, "object_detector")
        self.score_threshold = settings.score_threshold
        self.iou_threshold = settings.iou_threshold

    def batch_images(self, tensors: list[torch.Tensor]) -> Any:
        """Full-size images: one stacked tensor when they share a size, else a list
        (torchvision's detection models take either)."""
        if len({tensor.shape for tensor in tensors}) == 1:
            return super().batch_images(tensors)
        return [self.to_device(tensor) for tensor in tensors]

    def _detections(
        self, boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, *, nms: bool
    ) -> list[dict[str, Any]]:
        confident = scores >= self.score_threshold
        boxes, scores, labels = boxes[confident], scores[confident], labels[confident]
        if nms:
            kept = batched_nms(boxes.float(), scores.float(), labels, self.iou_threshold)
            boxes, scores, labels = boxes[kept], scores[kept], labels[kept]
        results = []
        for box, score, label in zip(boxes.tolist(), scores.tolist(), labels.tolist(), strict=True):
            key = str(label)  # the class index, as TorchServe's map_class_to_label keys it
            name = self.mapping.get(key, key) if self.mapping else key
            results.append({name: box, "score": score})
        return results

    def postprocess(self, data: Any) -> list[list[dict[str, Any]]]:
        if isinstance(data, torch.Tensor):  # (batch, N, 6) candidates
            return [
                self._detections(row[:, :4], row[:, 4], row[:, 5].long(), nms=True) for row in data
            ]
        return [
            self._detections(d["boxes"], d["scores"], d["labels"].long(), nms=False) for d in data
        ]


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
