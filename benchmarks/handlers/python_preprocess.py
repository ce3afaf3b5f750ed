"""A handler whose preprocessing is pure Python (parsing comma-separated numbers and
standardising them in a loop), so it holds the GIL: threads cannot overlap it, processes
can."""

import torch
from ts.torch_handler.base_handler import BaseHandler


def _features(text: str) -> list[float]:
    values = [float(token) for token in text.split(",")]
    mean = sum(values) / len(values)
    spread = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5 or 1.0
    return [(v - mean) / spread for v in values]


class PythonPreprocess(BaseHandler):
    def preprocess(self, data):
        return torch.tensor(
            [_features(bytes(row.get("body") or row.get("data")).decode()) for row in data]
        )

    def postprocess(self, data):
        return data.argmax(1).tolist()
