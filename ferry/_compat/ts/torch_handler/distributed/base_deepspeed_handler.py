"""TorchServe compatibility: ``ts.torch_handler.distributed.base_deepspeed_handler``;
``initialize`` fails the load (Ferry does not launch torchrun workers)."""

from ferry.handlers.torchserve.distributed import BaseDeepSpeedHandler

__all__ = ["BaseDeepSpeedHandler"]
