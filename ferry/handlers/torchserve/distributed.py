"""TorchServe's multi-process large-model helpers, which Ferry cannot run: the names
``ts.torch_handler.distributed.*`` and ``ts.handler_utils.distributed.*`` provide.

TorchServe serves DeepSpeed and PiPPy models by launching each worker through ``torchrun``
(model-config.yaml's ``parallelType`` and ``torchrun`` keys): one process per GPU, all
ranks of one model, with ``LOCAL_RANK`` and ``WORLD_SIZE`` set. A Ferry worker is one
process. So these names import (a handler file that imports them at its top still loads
as far as its ``initialize``), and the first use fails the model's load with one line,
``NotSupportedByFerry: ...``, which describe shows as the model's ``loadError``.

Failing on use rather than on import: a handler's module import and its ``initialize``
both run inside the worker's load and both reach ``loadError``; TorchServe's examples call
``super().initialize(ctx)`` before loading any weights, so nothing costly runs first; and a
user's unit tests, or any tool that only imports the handler file, keep working.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.torchserve.unsupported import NotSupportedByFerry

NO_TORCHRUN = (
    "Ferry runs each worker as one process and does not launch torchrun multi-process "
    "workers (model-config.yaml's parallelType/torchrun), so there are no ranks to "
    "split the model across; serve it from one process with BaseHandler, or with TorchServe"
)


def refuse(feature: str) -> NoReturn:
    """Fail the model's load: ``feature`` needs torchrun's processes."""
    raise NotSupportedByFerry(f"{feature} is not supported: {NO_TORCHRUN}")


DEEPSPEED = "DeepSpeed tensor parallelism (BaseDeepSpeedHandler, get_ds_engine)"
PIPPY = "PiPPy pipeline parallelism (BasePippyHandler, get_pipeline_driver)"


class BaseDeepSpeedHandler(BaseHandler):
    """TorchServe's base for DeepSpeed handlers; its ``initialize`` fails the load."""

    def initialize(self, context: Any) -> None:
        refuse(DEEPSPEED)


class BasePippyHandler(BaseHandler):
    """TorchServe's base for PiPPy handlers; its ``initialize`` fails the load."""

    def initialize(self, context: Any) -> None:
        refuse(PIPPY)


def get_ds_engine(model: Any, ctx: Any) -> NoReturn:
    """``ts.handler_utils.distributed.deepspeed.get_ds_engine``: fails the load."""
    refuse(DEEPSPEED)


def create_checkpoints_json(model_path: Any, checkpoints_json: Any) -> NoReturn:
    """``ts.handler_utils.distributed.deepspeed.create_checkpoints_json``: fails the load."""
    refuse(DEEPSPEED)


def initialize_rpc_workers(local_rank: Any, world_size: Any, ctx: Any) -> NoReturn:
    """``ts.handler_utils.distributed.pt_pippy.initialize_rpc_workers``: fails the load."""
    refuse(PIPPY)


def get_pipeline_driver(model: Any, world_size: Any, ctx: Any) -> NoReturn:
    """``ts.handler_utils.distributed.pt_pippy.get_pipeline_driver``: fails the load."""
    refuse(PIPPY)
