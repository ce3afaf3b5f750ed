"""TorchServe compatibility: ``ts.torch_handler.unit_tests.test_utils``."""
