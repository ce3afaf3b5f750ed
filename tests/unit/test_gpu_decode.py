"""GPU JPEG decoding: the tensor resize/crop matches PIL's, unusable decoders fall back to
PIL, and images the decoder refuses are decoded by PIL or fail alone. The decoder is a
stand-in here (CI has no GPU); it decodes with PIL at full resolution, as nvJPEG does."""

from __future__ import annotations

import io
import logging
import random
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFilter

from ferry.handlers.builtin.gpu_decode import (
    decode_each,
    is_jpeg,
    load_gpu_jpeg_decoder,
    probe,
)
from ferry.handlers.builtin.image_classifier import ImageClassifier
from ferry.handlers.builtin.vision import ImageTransform
from ferry.handlers.contract.context import Context


def _photo(seed: int, size: tuple[int, int] = (640, 480), fmt: str = "JPEG") -> bytes:
    rng = random.Random(seed)
    image = Image.new("RGB", size, (rng.randrange(256), 90, 160))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x, y, r = rng.randrange(size[0]), rng.randrange(size[1]), rng.randrange(20, 160)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=(rng.randrange(256), 40, 200))
    buffer = io.BytesIO()
    image.filter(ImageFilter.GaussianBlur(2)).save(buffer, format=fmt, quality=92)
    return buffer.getvalue()


def _full_resolution(encoded: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(encoded)) as image:
        array = np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
    return torch.from_numpy(array).permute(2, 0, 1)


class FakeDecoder:
    """Decodes JPEGs at full resolution; refuses the whole call if any image is bad."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, images: list[bytes]) -> list[torch.Tensor]:
        self.calls.append(len(images))
        return [_full_resolution(image) for image in images]


@pytest.mark.parametrize("size", [(640, 480), (300, 900), (256, 256)])
def test_tensor_resize_and_crop_match_pil(size: tuple[int, int]) -> None:
    transform = ImageTransform(resize=256, crop=224)
    encoded = _photo(1, size)
    with Image.open(io.BytesIO(encoded)) as image:
        reference = transform.to_uint8(image.convert("RGB"))
    ours = transform.resize_crop_tensor(_full_resolution(encoded))
    assert ours.shape == reference.shape == (3, 224, 224)
    difference = (ours.int() - reference.int()).abs().float()
    assert difference.mean() < 1.0 and difference.max() <= 8


def test_no_gpu_or_no_torchvision_means_pil(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "ferry.handlers"):
        assert load_gpu_jpeg_decoder(torch.device("cpu")) is None
    assert "gpu_decode needs a GPU" in caplog.text


def test_decode_each_isolates_refused_images(caplog: pytest.LogCaptureFixture) -> None:
    decoder = FakeDecoder()
    good, bad = _photo(1), b"\xff\xd8\xff" + b"not really a jpeg"
    with caplog.at_level(logging.WARNING, "ferry.handlers"):
        decoded, refused = decode_each(decoder, {0: good, 3: bad, 5: good})
    assert sorted(decoded) == [0, 5] and refused == [3]
    assert decoder.calls == [3, 1, 2, 1, 1]  # the batch, then halves down to the bad one
    assert "refused 1 of 3 JPEGs" in caplog.text
    assert decode_each(decoder, {}) == ({}, [])
    assert is_jpeg(good) and not is_jpeg(_photo(1, fmt="PNG"))


def _truncated(encoded: bytes) -> bytes:
    return encoded[: len(encoded) // 2]


def _cmyk_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("CMYK", (64, 48), (10, 200, 30, 0)).save(buffer, format="JPEG")
    return buffer.getvalue()


class StrictDecoder(FakeDecoder):
    """As nvJPEG: refuses a whole call holding a CMYK or truncated JPEG."""

    def __call__(self, images: list[bytes]) -> list[torch.Tensor]:
        self.calls.append(len(images))
        decoded = []
        for image in images:
            with Image.open(io.BytesIO(image)) as opened:
                if opened.mode != "RGB":
                    raise RuntimeError(f"unsupported mode {opened.mode}")
                opened.load()  # raises on a truncated file
            decoded.append(_full_resolution(image))
        return decoded


def test_one_bad_jpeg_among_64_costs_a_few_calls_not_64() -> None:
    images = {i: _photo(i % 4, (64, 48)) for i in range(64)}
    images[17] = _cmyk_jpeg()
    images[40] = _truncated(_photo(9, (64, 48)))
    decoder = StrictDecoder()
    decoded, refused = decode_each(decoder, images)
    assert refused == [17, 40]
    assert sorted(decoded) == [i for i in range(64) if i not in (17, 40)]
    assert len(decoder.calls) <= 4 * 6 + 1  # two bad ones, halves of 64: 6 levels each


def test_a_decoder_that_fails_the_probe_is_not_used() -> None:
    assert probe(FakeDecoder()) is None

    def broken(images: list[bytes]) -> list[torch.Tensor]:
        raise RuntimeError("nvjpeg: NVJPEG_STATUS_ARCH_MISMATCH")

    def wrong(images: list[bytes]) -> list[torch.Tensor]:
        return [torch.zeros(1, 16, 16, dtype=torch.uint8)]

    assert probe(broken) == "RuntimeError: nvjpeg: NVJPEG_STATUS_ARCH_MISMATCH"
    assert probe(wrong) == "it answered a tensor of shape (1, 16, 16) for a 16x16 RGB JPEG"


def _classifier(tmp_path: Any) -> ImageClassifier:
    handler = ImageClassifier()
    config = {"image_classifier": {"resize": 64, "crop": 56, "gpu_decode": True}}
    handler.initialize(
        Context("m", str(tmp_path), {"model": {}}, 8, None, model_yaml_config=config)
    )
    torch.manual_seed(0)
    handler.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 56 * 56, 4))
    return handler


def test_gpu_decoded_batches_match_the_pil_path(tmp_path: Any) -> None:
    handler = _classifier(tmp_path)
    assert handler.jpeg_decoder is None  # this worker has no GPU: PIL
    rows = [{"body": bytearray(_photo(seed))} for seed in range(4)]
    on_cpu = handler.preprocess(rows)
    handler.jpeg_decoder = decoder = FakeDecoder()
    on_device = handler.preprocess(rows)
    assert decoder.calls == [4]
    assert on_cpu is not None and on_device is not None
    # Normalised pixels a few levels apart: 8 / 255 / 0.225 ~ 0.14.
    assert (on_device - on_cpu).abs().mean() < 0.03
    assert torch.equal(handler.inference(on_device).argmax(1), handler.inference(on_cpu).argmax(1))


def test_images_the_gpu_refuses_go_through_pil_or_fail_alone(tmp_path: Any) -> None:
    handler = _classifier(tmp_path)
    handler.jpeg_decoder = FakeDecoder()
    rows: list[dict[str, Any]] = [
        {"body": bytearray(_photo(1))},
        {"body": bytearray(_photo(2, fmt="PNG"))},  # not a JPEG: PIL
        {"body": bytearray(b"\xff\xd8\xff broken")},  # refused by both: fails alone
        {"body": "%%% not base64"},  # not even bytes
        {"body": bytearray(_photo(3))},
    ]
    batch = handler.preprocess(rows)
    assert batch is not None and batch.shape == (3, 3, 56, 56)
    assert sorted(handler.failures) == [2, 3]
    results = handler.handle(rows, Context("m", ".", {"model": {}}, 5, None))
    assert [isinstance(r, Exception) for r in results] == [False, False, True, True, False]
