"""ResNet's image pipeline in PIL and torch only: what the TorchServe-style handler
(``resnet_handler.py``) and the Triton model of the peer benchmark (``triton_resnet.py``)
both run, so every server does the same work per request."""

import io

import numpy as np
import torch
from PIL import Image

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def image_tensor(encoded):
    """A JPEG/PNG as a 3x224x224 uint8 tensor: shorter side to 256, centre crop."""
    image = Image.open(io.BytesIO(encoded))
    width, height = image.size
    scale = 256 / min(width, height)
    if image.format == "JPEG" and scale < 1:
        image.draft("RGB", (int(width * scale) + 1, int(height * scale) + 1))
    image = image.convert("RGB")
    width, height = image.size
    scale = 256 / min(width, height)
    image = image.resize((round(width * scale), round(height * scale)), Image.BILINEAR)
    left, top = (image.width - 224) // 2, (image.height - 224) // 2
    image = image.crop((left, top, left + 224, top + 224))
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


def normalised(images):
    """A batch of uint8 images as the float input ResNet expects."""
    return (torch.stack(images).float() - MEAN) / STD


def top5(logits):
    """Each row's five likeliest classes: ``{class: probability}``."""
    probabilities, classes = torch.softmax(logits, dim=1).topk(5, dim=1)
    return [
        {str(c): p for c, p in zip(row_classes, row_probs, strict=True)}
        for row_probs, row_classes in zip(probabilities.tolist(), classes.tolist(), strict=True)
    ]
