"""Image decoding and the resize / center-crop / normalise transform, in PIL and torch only.

torchvision is optional: it is not needed for any of this. ``DefaultImageProcessing`` and
``ImageToTensor`` are the vision handlers' default ``image_processing`` (TorchServe's
torchvision transforms, rewritten in PIL and torch).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ferry.config.image_limits import ImageLimits
from ferry.config.sections import IMAGENET_MEAN, IMAGENET_STD
from ferry.errors import InvalidInput


def image_bytes(row: dict[str, Any]) -> bytes:
    """The encoded image of one request: form field ``data`` or the raw body; str is base64."""
    value = row.get("data")
    if value is None:
        value = row.get("body")
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidInput("image is neither raw bytes nor valid base64") from exc
    if isinstance(value, dict) and isinstance(value.get("b64"), str):
        return image_bytes({"body": value["b64"]})
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidInput("expected an image in the request body or the form field 'data'")


@contextlib.contextmanager
def _as_invalid_input() -> Iterator[None]:
    """PIL's errors for an image it cannot read, as the request's ``InvalidInput``."""
    try:
        yield
    except UnidentifiedImageError as exc:
        raise InvalidInput("cannot decode image: not a recognised image format") from exc
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidInput(f"cannot decode image: {exc}") from exc


@dataclass(frozen=True)
class ImageTransform:
    """Resize the shorter side, center-crop, scale to [0, 1], normalise (torchvision's recipe).

    Images whose format or size ``limits`` refuse fail with ``InvalidInput`` before any
    pixel is decoded.
    """

    resize: int = 256
    crop: int = 224
    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD
    limits: ImageLimits = field(default_factory=ImageLimits)
    draft: bool = False
    """JPEG draft mode (``draft_decode``): decode at the smallest scale that still covers
    the resize, instead of the whole image TorchServe decodes."""

    def _open(self, encoded: bytes) -> Image.Image:
        """The image with only its header read, if ``limits`` allow decoding it."""
        image = Image.open(io.BytesIO(encoded))
        width, height = image.size
        refusal = self.limits.refusal(width, height, image.format)
        if refusal is not None:
            raise InvalidInput(refusal)
        return image

    def check(self, encoded: bytes) -> None:
        """Raise ``InvalidInput`` unless ``limits`` allow the image (for a decoder other
        than PIL, such as the GPU's; ``decode`` checks by itself)."""
        with _as_invalid_input():
            self._open(encoded)

    def open(self, encoded: bytes) -> Image.Image:
        """The image decoded as it is stored (no mode forced), if ``limits`` allow it."""
        with _as_invalid_input():
            image = self._open(encoded)
            image.load()  # decoding errors are the request's, not the transform's
            return image

    def decode(self, encoded: bytes) -> Image.Image:
        """Decode to RGB: the whole image, or with ``draft`` a large JPEG at the smallest
        scale that still covers the resize."""
        with _as_invalid_input():
            image = self._open(encoded)
            width, height = image.size
            scale = self.resize / min(width, height)
            if self.draft and image.format == "JPEG" and scale < 1:
                image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
            return image.convert("RGB")

    def to_uint8(self, image: Image.Image) -> torch.Tensor:
        """Resize and crop one image as torchvision does (``resized_size``,
        ``crop_origin``); returns a CHW uint8 tensor."""
        width, height = resized_size(image.size, self.resize)
        if (width, height) != image.size:
            image = image.resize((width, height), Image.Resampling.BILINEAR)
        left, top = crop_origin((width, height), self.crop)
        image = image.crop((left, top, left + self.crop, top + self.crop))
        return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)

    def resize_crop_tensor(self, image: torch.Tensor) -> torch.Tensor:
        """``to_uint8`` for a decoded CHW uint8 tensor on any device (GPU-decoded images).

        Antialiased bilinear interpolation, as PIL's resize; pixels differ from it by a
        level or two.
        """
        _, height, width = image.shape
        new_width, new_height = resized_size((width, height), self.resize)
        if (new_width, new_height) != (width, height):
            resized = torch.nn.functional.interpolate(
                image[None].float(), size=(new_height, new_width), mode="bilinear", antialias=True
            )[0]
            image = resized.round_().clamp_(0, 255).to(torch.uint8)
        left, top = crop_origin((new_width, new_height), self.crop)
        return image[:, top : top + self.crop, left : left + self.crop]

    def normalise(self, batch: torch.Tensor) -> torch.Tensor:
        """uint8 NCHW → float NCHW, normalised, for the whole batch at once, on whichever
        device the batch is. Scaled to [0, 1] first, then normalised, in float32 as
        torchvision's ``ToTensor`` and ``Normalize`` round: subtracting ``mean * 255`` and
        dividing by ``std * 255`` instead moves the input by up to 2.4e-7, which a deep
        model with random weights turned into answers 3.5e-3 apart (docs/handlers.md)."""
        mean = torch.tensor(self.mean, device=batch.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=batch.device).view(1, -1, 1, 1)
        return batch.float().div(255).sub_(mean).div_(std)


def resized_size(size: tuple[int, int], shorter: int) -> tuple[int, int]:
    """torchvision's ``Resize(shorter)``: the shorter side becomes ``shorter``, the longer
    one keeps the aspect ratio, truncated.

    >>> resized_size((1000, 667), 256), resized_size((720, 720), 256)
    ((383, 256), (256, 256))
    """
    width, height = size
    short, long = min(width, height), max(width, height)
    new_long = int(shorter * long / short)
    return (shorter, new_long) if width <= height else (new_long, shorter)


def crop_origin(size: tuple[int, int], crop: int) -> tuple[int, int]:
    """torchvision's ``CenterCrop(crop)``: the crop's left and top, half the margin
    rounded (half to even, as Python rounds).

    >>> crop_origin((383, 256), 224), crop_origin((333, 256), 224)
    ((80, 16), (54, 16))
    """
    width, height = size
    return round((width - crop) / 2.0), round((height - crop) / 2.0)


def image_to_tensor(image: Image.Image) -> torch.Tensor:
    """torchvision's ``ToTensor``: CHW, one channel per band, 8-bit images scaled to [0, 1]."""
    array = np.array(image, copy=True)
    if image.mode == "1":
        array = array.astype(np.uint8) * 255
    tensor = torch.from_numpy(array)
    if tensor.ndim == 2:
        tensor = tensor[:, :, None]
    tensor = tensor.permute(2, 0, 1).contiguous()
    if tensor.dtype == torch.uint8:
        return tensor.float().div_(255)
    return tensor


class ImageToTensor:
    """``image_to_tensor`` as a transform object (TorchServe's ``ObjectDetector`` default)."""

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return image_to_tensor(image)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageToTensor)

    def __hash__(self) -> int:
        return hash(ImageToTensor)


@dataclass(frozen=True)
class DefaultImageProcessing:
    """torchvision's ``Resize(resize)``, ``CenterCrop(crop)``, ``ToTensor()``,
    ``Normalize(mean, std)`` on a PIL image, in PIL and torch (TorchServe's default
    ``image_processing``)::

        tensor = DefaultImageProcessing()(Image.open("kitten.jpg").convert("RGB"))
        tensor.shape  # torch.Size([3, 224, 224])
    """

    resize: int = 256
    crop: int = 224
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def __call__(self, image: Image.Image) -> torch.Tensor:
        size = resized_size(image.size, self.resize)
        if size != image.size:
            image = image.resize(size, Image.Resampling.BILINEAR)
        left, top = crop_origin(size, self.crop)
        image = image.crop((left, top, left + self.crop, top + self.crop))
        tensor = image_to_tensor(image).float()
        mean = torch.tensor(self.mean).view(-1, 1, 1)
        std = torch.tensor(self.std).view(-1, 1, 1)
        return (tensor - mean) / std
