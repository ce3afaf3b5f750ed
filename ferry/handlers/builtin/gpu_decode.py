"""Optional JPEG decoding on the GPU (nvJPEG through ``torchvision.io.decode_jpeg``).

Turned on per model with ``gpu_decode: true`` in the vision handler's model-config.yaml
section. It is used only when the worker has a GPU, torchvision imports and matches the
installed torch, and the decoder decodes a probe image at load; otherwise the worker logs
why (a warning) and decodes with PIL. Any image the GPU decoder refuses (not a JPEG, CMYK,
progressive on some versions, truncated) is decoded by PIL instead, so an answer never
depends on which decoder ran; a batch holding one is split in halves until the refused
images are found (a few calls, not one per image), and the refusals are logged.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable

import torch

log = logging.getLogger("ferry.handlers")

JpegDecoder = Callable[[list[bytes]], list[torch.Tensor]]
"""Encoded JPEGs in, CHW uint8 RGB tensors on the device out; raises if any one fails."""

JPEG_MAGIC = b"\xff\xd8\xff"


def is_jpeg(encoded: bytes) -> bool:
    return encoded.startswith(JPEG_MAGIC)


def load_gpu_jpeg_decoder(device: torch.device) -> JpegDecoder | None:
    """torchvision's batched nvJPEG decoder for ``device``, or None (and a log line why)."""
    if device.type != "cuda":
        log.warning("gpu_decode needs a GPU; this worker runs on %s and decodes with PIL", device)
        return None
    try:
        from torchvision.io import (  # type: ignore[import-not-found, unused-ignore]
            ImageReadMode,
            decode_jpeg,
        )
    except Exception as exc:  # missing, or built for another torch: both raise at import
        log.warning("gpu_decode: torchvision is not usable (%s); decoding with PIL", exc)
        return None

    def decode(images: list[bytes]) -> list[torch.Tensor]:
        data = [torch.frombuffer(bytearray(image), dtype=torch.uint8) for image in images]
        if len(data) == 1:  # one tensor: every torchvision with GPU decoding takes that
            return [decode_jpeg(data[0], mode=ImageReadMode.RGB, device=device)]
        # A list is decoded as one batch by torchvision >= 0.19 (older ones raise, and
        # decode_each then goes image by image).
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))

    failure = probe(decode)
    if failure is not None:
        log.warning("gpu_decode: the GPU decoder failed a probe (%s); decoding with PIL", failure)
        return None
    log.info("gpu_decode: JPEGs are decoded on %s", device)
    return decode


def probe_image() -> bytes:
    """A small baseline RGB JPEG, made here (PIL is at hand in every worker)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 90)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def probe(decoder: JpegDecoder) -> str | None:
    """Why ``decoder`` cannot be used (it fails a baseline JPEG, or answers something
    that is not a 3 x 16 x 16 image), or None."""
    try:
        (decoded,) = decoder([probe_image()])
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if tuple(decoded.shape) != (3, 16, 16):
        return f"it answered a tensor of shape {tuple(decoded.shape)} for a 16x16 RGB JPEG"
    return None


def decode_each(
    decoder: JpegDecoder, images: dict[int, bytes]
) -> tuple[dict[int, torch.Tensor], list[int]]:
    """Decode all of ``images`` in one call; if that fails, each half in turn, down to
    the images the decoder refuses (about 2 log2(n) calls for one bad image in n).

    Returns the decoded tensors by index, and the indexes the decoder refused.
    """
    decoded: dict[int, torch.Tensor] = {}
    refused: list[int] = []
    _decode_halves(decoder, images, list(images), decoded, refused)
    if refused:
        log.warning(
            "the GPU decoder refused %d of %d JPEGs; PIL decodes them", len(refused), len(images)
        )
    return decoded, sorted(refused)


def _decode_halves(
    decoder: JpegDecoder,
    images: dict[int, bytes],
    indexes: list[int],
    decoded: dict[int, torch.Tensor],
    refused: list[int],
) -> None:
    if not indexes:
        return
    try:
        decoded.update(zip(indexes, decoder([images[i] for i in indexes]), strict=True))
        return
    except Exception as exc:
        if len(indexes) == 1:
            log.debug("the GPU decoder refused image %d: %s", indexes[0], exc)
            refused.append(indexes[0])
            return
    middle = len(indexes) // 2
    _decode_halves(decoder, images, indexes[:middle], decoded, refused)
    _decode_halves(decoder, images, indexes[middle:], decoded, refused)
