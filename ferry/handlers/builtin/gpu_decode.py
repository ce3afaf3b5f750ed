"""Optional JPEG decoding on the GPU (nvJPEG through ``torchvision.io.decode_jpeg``).

Turned on per model with ``gpu_decode: true`` in the vision handler's model-config.yaml
section. It is used only when the worker has a GPU and torchvision imports and matches the
installed torch; otherwise the worker logs why and decodes with PIL. Any image the GPU
decoder refuses (not a JPEG, CMYK, corrupt) is decoded by PIL instead, so an answer never
depends on which decoder ran.
"""

from __future__ import annotations

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

    log.info("gpu_decode: JPEGs are decoded on %s", device)
    return decode


def decode_each(
    decoder: JpegDecoder, images: dict[int, bytes]
) -> tuple[dict[int, torch.Tensor], list[int]]:
    """Decode all of ``images`` in one call; if that fails, one by one.

    Returns the decoded tensors by index, and the indexes the decoder refused.
    """
    if not images:
        return {}, []
    indexes = list(images)
    try:
        return dict(zip(indexes, decoder([images[i] for i in indexes]), strict=True)), []
    except Exception:
        log.debug("batched GPU decode failed; decoding one by one", exc_info=True)
    decoded: dict[int, torch.Tensor] = {}
    refused: list[int] = []
    for index in indexes:
        try:
            decoded[index] = decoder([images[index]])[0]
        except Exception:
            refused.append(index)
    return decoded, refused
