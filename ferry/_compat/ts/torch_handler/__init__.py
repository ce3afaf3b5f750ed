"""TorchServe compatibility: ``ts.torch_handler``."""
