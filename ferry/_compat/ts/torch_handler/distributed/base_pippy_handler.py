"""TorchServe compatibility: ``ts.torch_handler.distributed.base_pippy_handler``;
``initialize`` fails the load (Ferry does not launch torchrun workers)."""

from ferry.handlers.torchserve.distributed import BasePippyHandler

__all__ = ["BasePippyHandler"]
