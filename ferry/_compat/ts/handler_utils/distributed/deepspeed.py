"""TorchServe compatibility: ``ts.handler_utils.distributed.deepspeed``; each function
fails the load (Ferry does not launch torchrun workers)."""

from ferry.handlers.torchserve.distributed import create_checkpoints_json, get_ds_engine

__all__ = ["create_checkpoints_json", "get_ds_engine"]
