"""ResNet image classification written to TorchServe's handler contract, with PIL and torch
only (TorchServe's own image_classifier needs torchvision, which this CPU torch lacks), so
the very same file runs under TorchServe and under Ferry. The archive carries
``resnet_pipeline.py`` beside it (both servers put the model folder on ``sys.path``)."""

from resnet_pipeline import image_tensor, normalised, top5
from ts.torch_handler.base_handler import BaseHandler


class ResNetHandler(BaseHandler):
    def preprocess(self, data):
        return normalised([image_tensor(row.get("data") or row.get("body")) for row in data])

    def postprocess(self, data):
        return top5(data)
