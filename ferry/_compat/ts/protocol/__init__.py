"""TorchServe compatibility: ``ts.protocol``."""
