"""TorchServe compatibility: ``ts.handler_utils.distributed.pt_pippy``; each function
fails the load (Ferry does not launch torchrun workers)."""

from ferry.handlers.torchserve.distributed import get_pipeline_driver, initialize_rpc_workers

__all__ = ["get_pipeline_driver", "initialize_rpc_workers"]
