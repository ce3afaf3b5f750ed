"""TorchServe compatibility: ``ts.utils``."""
