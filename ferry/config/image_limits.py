"""What the built-in vision handlers agree to decode, judged from an image's header alone.

Pure data: the frontend builds it from the settings (``limit_max_image_pixels``,
``allowed_image_formats``) and each worker gets it in its ``HandlerSpec``; the handlers'
decoding (``ferry.handlers.builtin.vision``) asks ``refusal`` before decoding a pixel.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
"""40 megapixels: 160 MB of RGBA, above any camera's JPEG a model would be asked about."""
DEFAULT_IMAGE_FORMATS = ("JPEG", "PNG")

# PIL names a JPEG with the multi-picture extension (what many cameras write) "MPO".
_SAME_FORMAT = {"MPO": "JPEG"}


@dataclass(frozen=True)
class ImageLimits:
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    """Largest width * height decoded; None leaves only PIL's own decompression-bomb check."""
    formats: tuple[str, ...] = DEFAULT_IMAGE_FORMATS
    """PIL format names (``Image.format``) decoded, upper case; any other is refused."""

    def refusal(self, width: int, height: int, image_format: str | None) -> str | None:
        """Why an image with this header must not be decoded, or None when it may be.

        >>> ImageLimits(max_pixels=100).refusal(20, 10, "PNG")
        'image of 20x10 = 200 pixels exceeds the limit of 100 (limit_max_image_pixels)'
        """
        name = _SAME_FORMAT.get(image_format or "", image_format or "unknown")
        if name not in self.formats:
            allowed = ", ".join(self.formats) or "none"
            return f"image format {name} is not allowed (allowed_image_formats: {allowed})"
        pixels = width * height
        if self.max_pixels is not None and pixels > self.max_pixels:
            return (
                f"image of {width}x{height} = {pixels} pixels exceeds the limit of "
                f"{self.max_pixels} (limit_max_image_pixels)"
            )
        return None
