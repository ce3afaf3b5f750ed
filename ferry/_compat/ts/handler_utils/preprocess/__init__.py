"""TorchServe compatibility: ``ts.handler_utils.preprocess``."""
