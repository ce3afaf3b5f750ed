"""Synthetic shape images for the demo model: drawn with PIL, so nothing is downloaded."""

from __future__ import annotations

import io
import math
import random

from PIL import Image, ImageDraw

LABELS = ("circle", "square", "triangle", "star", "cross")
IMAGE_SIZE = 64


def _polygon(
    cx: float, cy: float, radius: float, corners: int, angle: float, inner: float = 1.0
) -> list[tuple[float, float]]:
    points = []
    steps = corners * (2 if inner < 1 else 1)
    for i in range(steps):
        r = radius if inner >= 1 or i % 2 == 0 else radius * inner
        theta = angle + 2 * math.pi * i / steps
        points.append((cx + r * math.cos(theta), cy + r * math.sin(theta)))
    return points


def _cross(cx: float, cy: float, radius: float, angle: float) -> list[tuple[float, float]]:
    w = radius * 0.35
    outline = [
        (-w, -radius),
        (w, -radius),
        (w, -w),
        (radius, -w),
        (radius, w),
        (w, w),
        (w, radius),
        (-w, radius),
        (-w, w),
        (-radius, w),
        (-radius, -w),
        (-w, -w),
    ]
    cos, sin = math.cos(angle), math.sin(angle)
    return [(cx + x * cos - y * sin, cy + x * sin + y * cos) for x, y in outline]


def _colour(rng: random.Random) -> tuple[int, int, int]:
    return (rng.randrange(256), rng.randrange(256), rng.randrange(256))


def _contrasting(rng: random.Random, background: tuple[int, int, int]) -> tuple[int, int, int]:
    while True:
        colour = _colour(rng)
        if sum(abs(a - b) for a, b in zip(colour, background, strict=True)) > 180:
            return colour


def draw_shape(label: str, rng: random.Random, size: int = IMAGE_SIZE) -> Image.Image:
    """One image of ``label`` at a random place, size, rotation and colours."""
    background = _colour(rng)
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    fill = _contrasting(rng, background)
    radius = rng.uniform(size * 0.2, size * 0.4)
    cx = rng.uniform(radius, size - radius)
    cy = rng.uniform(radius, size - radius)
    angle = rng.uniform(0, 2 * math.pi)
    if label == "circle":
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=fill)
    elif label == "square":
        draw.polygon(_polygon(cx, cy, radius, 4, angle), fill=fill)
    elif label == "triangle":
        draw.polygon(_polygon(cx, cy, radius, 3, angle), fill=fill)
    elif label == "star":
        draw.polygon(_polygon(cx, cy, radius, 5, angle, inner=0.45), fill=fill)
    elif label == "cross":
        draw.polygon(_cross(cx, cy, radius, angle), fill=fill)
    else:
        raise ValueError(f"unknown shape {label!r}")
    return image


def encode(image: Image.Image, image_format: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


def labelled_samples(count: int, seed: int) -> list[tuple[str, Image.Image]]:
    """``count`` (label, image) pairs, labels balanced, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [
        (LABELS[i % len(LABELS)], draw_shape(LABELS[i % len(LABELS)], rng)) for i in range(count)
    ]


def write_samples(folder: str, seed: int = 2024) -> None:
    """One PNG per shape, named after its label (the README's curl examples use them)."""
    import pathlib

    target = pathlib.Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for label in LABELS:
        (target / f"{label}.png").write_bytes(encode(draw_shape(label, rng)))
