"""TorchServe compatibility: ``ts.torch_handler.dali_handler``."""

from ferry.handlers.torchserve.dali import DALIHandler

__all__ = ["DALIHandler"]
