"""TorchServe's handler utilities, for handlers written against ``ts.*``."""
