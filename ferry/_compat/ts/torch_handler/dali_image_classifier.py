"""TorchServe compatibility: ``ts.torch_handler.dali_image_classifier``."""

from ferry.handlers.torchserve.dali import DALIImageClassifier

__all__ = ["DALIImageClassifier"]
