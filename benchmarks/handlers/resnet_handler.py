"""ResNet image classification written to TorchServe's handler contract, with PIL and torch
only (TorchServe's own image_classifier needs torchvision, which this CPU torch lacks), so
the very same file runs under TorchServe and under Ferry."""

import io

import numpy as np
import torch
from PIL import Image
from ts.torch_handler.base_handler import BaseHandler

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def _image(row):
    value = row.get("data") or row.get("body")
    image = Image.open(io.BytesIO(value))
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


class ResNetHandler(BaseHandler):
    def preprocess(self, data):
        batch = torch.stack([_image(row) for row in data]).float()
        return (batch - MEAN) / STD

    def postprocess(self, data):
        probabilities, classes = torch.softmax(data, dim=1).topk(5, dim=1)
        return [
            {str(c): p for c, p in zip(row_classes, row_probs, strict=True)}
            for row_probs, row_classes in zip(probabilities.tolist(), classes.tolist(), strict=True)
        ]
