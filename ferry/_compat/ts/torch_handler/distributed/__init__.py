"""TorchServe compatibility: ``ts.torch_handler.distributed`` (torchrun-launched handlers,
which Ferry does not run: ``ferry.handlers.torchserve.distributed``)."""
