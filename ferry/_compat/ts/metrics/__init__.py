"""TorchServe compatibility: ``ts.metrics``."""
