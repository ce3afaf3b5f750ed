"""Raw pixels in (a 3x224x224 uint8 array per request body), top-5 out: the server's own
cost on a GPU with no JPEG decoding. Pixels travel pinned as uint8 and are normalised on
the device."""

from typing import Any

import numpy as np
import torch

from ferry.handlers.builtin.image_classifier import ImageClassifier

SHAPE = (3, 224, 224)


class TensorClassifier(ImageClassifier):
    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        pixels = [
            np.frombuffer(row.get("body") or row.get("data"), dtype=np.uint8).reshape(SHAPE)
            for row in data
        ]
        return self.to_device(torch.from_numpy(np.stack(pixels)), self.transform.normalise)
