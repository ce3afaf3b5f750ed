"""Small segmentation, detection and embedding models, defined here so their example
archives need no download (random weights; ``build_vision_archives`` packages them)."""

from __future__ import annotations

import torch
from torch import nn


class TinySegmenter(nn.Module):
    """Per-pixel scores for ``classes`` classes at the input's resolution."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, classes, 1),
        )

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.body(x)}


class TinyDetector(nn.Module):
    """``(batch, cells, 6)`` candidates ``x1, y1, x2, y2, score, label`` in each image's own
    pixels: one box per cell of an 8x8 grid, sized and scored by a small convolutional head.
    Takes a batch tensor or a list of CHW images of any sizes, as torchvision's detectors."""

    def __init__(self, classes: int = 3, grid: int = 8) -> None:
        super().__init__()
        self.grid = grid
        self.head = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(grid),
            nn.Conv2d(16, 3 + classes, 1),
        )

    def forward(self, images: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([self._candidates(image) for image in images])

    def _candidates(self, image: torch.Tensor) -> torch.Tensor:
        _, height, width = image.shape
        raw = self.head(image[None])[0].flatten(1)  # (3 + classes, grid * grid)
        cell_w, cell_h = width / self.grid, height / self.grid
        ys, xs = torch.meshgrid(torch.arange(self.grid), torch.arange(self.grid), indexing="ij")
        centre_x = (xs.flatten() + 0.5) * cell_w
        centre_y = (ys.flatten() + 0.5) * cell_h
        half = torch.sigmoid(raw[0])
        score = torch.sigmoid(raw[1] + raw[2])
        label = raw[3:].argmax(0).float()
        boxes = [centre_x - half * cell_w, centre_y - half * cell_h]
        boxes += [centre_x + half * cell_w, centre_y + half * cell_h]
        return torch.stack([*boxes, score, label], dim=1)


class TinyEmbedder(nn.Module):
    """A 32-dimensional embedding per image."""

    def __init__(self, dimensions: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, dimensions, 3, stride=2, padding=1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        embedding: torch.Tensor = self.body(x)
        return embedding
