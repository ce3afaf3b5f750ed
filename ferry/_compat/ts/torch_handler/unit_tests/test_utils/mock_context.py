"""TorchServe compatibility: ``...unit_tests.test_utils.mock_context``."""

from ferry.handlers.torchserve.mock_context import MockContext

__all__ = ["MockContext"]
