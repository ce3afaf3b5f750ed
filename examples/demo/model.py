"""The demo model: a small CNN that tells five drawn shapes apart (about 60k parameters)."""

import torch
from torch import nn


def _block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, 3, padding=1, bias=False),
        nn.BatchNorm2d(outputs),
        nn.ReLU(inplace=True),
    )


class ShapesNet(nn.Module):
    def __init__(self, num_classes: int = 5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _block(3, 16),
            nn.MaxPool2d(2),
            _block(16, 32),
            nn.MaxPool2d(2),
            _block(32, 64),
            nn.MaxPool2d(2),
            _block(64, 64),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(torch.flatten(self.features(x), 1))
        return logits
