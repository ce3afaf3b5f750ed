"""TorchServe compatibility namespace, served by Ferry."""
