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
    """``(batch, cells, 6)`` candidates ``x1, y1, x2, y2, score, label``: one box per cell of
    an 8x8 grid, sized and scored by a small convolutional head."""

    def __init__(self, classes: int = 3, grid: int = 8) -> None:
        super().__init__()
        self.grid = grid
        self.head = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(grid),
            nn.Conv2d(16, 3 + classes, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-1]
        raw = self.head(x)  # (batch, 3 + classes, grid, grid)
        cell = size / self.grid
        ys, xs = torch.meshgrid(torch.arange(self.grid), torch.arange(self.grid), indexing="ij")
        centre_x = (xs.flatten() + 0.5) * cell
        centre_y = (ys.flatten() + 0.5) * cell
        half = torch.sigmoid(raw[:, 0].flatten(1)) * cell
        score = torch.sigmoid(raw[:, 1].flatten(1) + raw[:, 2].flatten(1))
        label = raw[:, 3:].flatten(2).argmax(1).float()
        boxes = torch.stack(
            [centre_x - half, centre_y - half, centre_x + half, centre_y + half], dim=2
        )
        return torch.cat([boxes, score.unsqueeze(2), label.unsqueeze(2)], dim=2)


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
