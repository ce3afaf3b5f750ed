"""TorchServe compatibility: ``ts.handler_utils.distributed`` (torchrun-launched helpers,
which Ferry does not run: ``ferry.handlers.torchserve.distributed``)."""
