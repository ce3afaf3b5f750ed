"""``MockContext``: a real ``Context`` for a handler's unit tests, built from the few values
TorchServe's ``ts.torch_handler.unit_tests.test_utils.mock_context.MockContext`` takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ferry.handlers.contract.context import Context


class MockContext(Context):
    """A context for one request with no headers, as a worker would give the handler.

    Example::

        context = MockContext(model_pt_file="model.pt", model_dir="tmp", model_file="net.py")
        handler.initialize(context)
        handler.handle([{"data": b"..."}], context)
    """

    def __init__(
        self,
        model_pt_file: str | None = "model.pt",
        model_dir: str = "ts/torch_handler/unit_tests/models/tmp",
        model_file: str | None = None,
        gpu_id: int | None = None,
        model_name: str = "mnist",
        model_yaml_config_file: str | None = None,
    ) -> None:
        model: dict[str, str] = {"modelName": model_name}
        if model_pt_file is not None:
            model["serializedFile"] = model_pt_file
        if model_file is not None:
            model["modelFile"] = model_file
        config: dict[str, Any] = {}
        if model_yaml_config_file is not None:
            path = Path(model_yaml_config_file)
            if not path.is_absolute() and not path.exists():
                path = Path(model_dir) / path
            config = yaml.safe_load(path.read_text()) or {}
        super().__init__(
            model_name,
            str(model_dir),
            {"model": model},
            1,
            gpu_id,
            model_yaml_config=config,
        )
        self.explain = False
        self.start_batch(["mock-request-0"], [{}])
