"""Vision handlers behave as TorchServe's: ``image_processing``, full-size detector input,
TorchServe's output shapes and label keys."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from ferry.config.image_limits import ImageLimits
from ferry.errors import InvalidInput
from ferry.handlers.builtin.image_classifier import ImageClassifier
from ferry.handlers.builtin.vision import DefaultImageProcessing, ImageToTensor, ImageTransform
from ferry.handlers.builtin.vision_tasks import ImageSegmenter, ObjectDetector
from ferry.handlers.contract.context import Context
from tests.fixtures.handler_inputs import png
from tests.fixtures.vision_compat import MnistNet, digit_png


def _context(model_dir: Path, **yaml: Any) -> Context:
    context = Context("m", str(model_dir), {"model": {}}, 4, None, model_yaml_config=yaml)
    return context


def _encode(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def _one_channel(image: Image.Image) -> torch.Tensor:
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255)
    return ((pixels - 0.1307) / 0.3081)[None]


class _MnistClassifier(ImageClassifier):
    image_processing = staticmethod(_one_channel)


def _handle(handler: Any, rows: list[dict[str, Any]], context: Context) -> list[Any]:
    context.start_batch([str(i) for i in range(len(rows))], [{} for _ in rows])
    result: list[Any] = handler.handle(rows, context)
    return result


def test_one_channel_image_processing_on_a_mode_l_png(tmp_path: Path) -> None:
    handler = _MnistClassifier()
    context = _context(tmp_path)
    handler.initialize(context)
    handler.model = MnistNet().eval()
    batch = handler.preprocess([{"body": bytearray(digit_png(1))}, {"data": digit_png(2)}])
    assert batch.shape == (2, 1, 28, 28) and batch.dtype == torch.float32
    answers = _handle(handler, [{"body": bytearray(digit_png(seed))} for seed in range(3)], context)
    assert len(answers) == 3
    for answer in answers:
        assert len(answer) == 5 and set(answer) <= {str(i) for i in range(10)}
        assert list(answer.values()) == sorted(answer.values(), reverse=True)


def test_image_processing_replaced_in_initialize(tmp_path: Path) -> None:
    class Replacing(ImageClassifier):
        def initialize(self, context: Context) -> None:
            super().initialize(context)
            self.image_processing = _one_channel

    handler = Replacing()
    handler.initialize(_context(tmp_path))
    assert handler.preprocess([{"body": digit_png()}]).shape == (1, 1, 28, 28)


def test_the_image_limits_apply_before_image_processing(tmp_path: Path) -> None:
    calls: list[Image.Image] = []

    def record(image: Image.Image) -> torch.Tensor:
        calls.append(image)
        return _one_channel(image)

    handler = _MnistClassifier()
    handler.initialize(_context(tmp_path))
    handler.image_processing = record
    handler.transform = ImageTransform(limits=ImageLimits(max_pixels=100))
    assert handler.preprocess([{"body": digit_png()}]) is None
    assert isinstance(handler.failures[0], InvalidInput) and not calls
    handler.transform = ImageTransform()
    assert handler.preprocess([{"body": b"not an image"}]) is None
    assert isinstance(handler.failures[0], InvalidInput) and not calls


def _reference(image: Image.Image) -> torch.Tensor:
    """torchvision's Resize(256), CenterCrop(224), ToTensor, Normalize(ImageNet), by hand."""
    width, height = image.size
    size = (256, int(256 * height / width)) if width <= height else (int(256 * width / height), 256)
    resized = np.asarray(image.resize(size, Image.Resampling.BILINEAR), dtype=np.float64)
    top = round((size[1] - 224) / 2.0)
    left = round((size[0] - 224) / 2.0)
    crop = resized[top : top + 224, left : left + 224] / 255
    mean = np.array([0.485, 0.456, 0.406])
    std = np.array([0.229, 0.224, 0.225])
    return torch.from_numpy((crop - mean) / std).permute(2, 0, 1).float()


@pytest.mark.parametrize("size", [(300, 400), (517, 289), (256, 256)])
def test_default_image_processing_is_callable_and_matches_torchvision(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    handler = ImageClassifier()
    assert callable(handler.image_processing)
    handler.initialize(_context(tmp_path))
    tensor = handler.image_processing(image)
    assert tensor.shape == (3, 224, 224)
    assert torch.allclose(tensor, _reference(image), atol=1e-5)
    assert handler.image_processing == DefaultImageProcessing()


def test_builtin_fast_path_agrees_with_image_processing(tmp_path: Path) -> None:
    handler = ImageClassifier()
    handler.initialize(_context(tmp_path))
    encoded = png((200, 30, 90), size=(320, 280))
    fast = handler.preprocess([{"body": encoded}])[0]
    slow = handler.image_processing(Image.open(io.BytesIO(encoded)).convert("RGB"))
    assert (fast - slow).abs().max() < 0.1  # uint8 rounding and crop offsets only


class _RecordingDetector(torch.nn.Module):
    """Records its input's shape; one box per image, in the input's own pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, images: Any) -> list[dict[str, torch.Tensor]]:
        outputs = []
        for image in images:
            self.shapes.append(tuple(image.shape))
            _, height, width = image.shape
            outputs.append(
                {
                    "boxes": torch.tensor([[1.0, 2.0, width - 1.0, height - 2.0], [0, 0, 5, 5]]),
                    "labels": torch.tensor([1, 2]),
                    "scores": torch.tensor([0.9, 0.2]),
                    "max": image.max().reshape(1),
                }
            )
        return outputs


@pytest.mark.parametrize("mapping", [None, {"1": "cat", "2": "dog"}])
def test_object_detector_gets_the_full_image_and_answers_in_its_pixels(
    tmp_path: Path, mapping: dict[str, str] | None
) -> None:
    if mapping:
        (tmp_path / "index_to_name.json").write_text(json.dumps(mapping))
    handler = ObjectDetector()
    context = _context(tmp_path)
    handler.initialize(context)
    model = _RecordingDetector()
    handler.model = model
    rows = [{"body": png((255, 255, 255), size=(640, 480))}, {"body": png((0, 0, 0), (300, 500))}]
    first, second = _handle(handler, rows, context)
    assert model.shapes == [(3, 480, 640), (3, 500, 300)]
    label = "cat" if mapping else "1"
    assert first == [{label: [1.0, 2.0, 639.0, 478.0], "score": pytest.approx(0.9)}]
    assert second == [{label: [1.0, 2.0, 299.0, 498.0], "score": pytest.approx(0.9)}]
    assert handler.image_processing == ImageToTensor()


def test_object_detector_input_is_a_zero_to_one_tensor(tmp_path: Path) -> None:
    handler = ObjectDetector()
    handler.initialize(_context(tmp_path))
    batch = handler.preprocess([{"body": png((255, 0, 0), size=(50, 40))}] * 2)
    assert batch.shape == (2, 3, 40, 50)
    assert batch[:, 0].min() == 1.0 and batch[:, 1:].max() == 0.0


@pytest.mark.parametrize(
    ("mapping", "expected"), [(None, {"2", "0"}), ({"0": "a", "1": "b", "2": "c"}, {"c", "a"})]
)
def test_classifier_topk_and_label_keys(
    tmp_path: Path, mapping: dict[str, str] | None, expected: set[str]
) -> None:
    if mapping:
        (tmp_path / "index_to_name.json").write_text(json.dumps(mapping))
    handler = ImageClassifier()
    handler.initialize(_context(tmp_path))
    assert handler.topk == 5
    handler.set_max_result_classes(2)
    (answer,) = handler.postprocess(torch.tensor([[2.0, 0.0, 3.0]]))
    assert set(answer) == expected and list(answer.values()) == sorted(answer.values())[::-1]
    assert sum(torch.softmax(torch.tensor([2.0, 0.0, 3.0]), 0).topk(2).values.tolist()) == (
        pytest.approx(sum(answer.values()))
    )


def test_segmenter_answers_class_and_probability_per_pixel() -> None:
    scores = torch.zeros(1, 3, 2, 2)
    scores[0, 2, 0, 0] = 5.0
    (mask,) = ImageSegmenter().postprocess({"out": scores})
    assert len(mask) == 2 and len(mask[0]) == 2
    assert mask[0][0][0] == 2.0 and mask[0][0][1] == pytest.approx(
        float(torch.softmax(torch.tensor([0.0, 0.0, 5.0]), 0)[2])
    )
    assert mask[1][1] == [0.0, pytest.approx(1 / 3)]
