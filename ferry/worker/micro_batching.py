"""``MicroBatching``: TorchServe's micro-batching handle (``ts.handler_utils.micro_batching``),
run on Ferry's stage pipeline (``ferry.worker.pipeline``).

A handler opts in from its own code, as TorchServe's example does (whose ``__init__`` skips
``super().__init__()``: the built-in handlers do not need it)::

    class Handler(ImageClassifier):
        def __init__(self):
            self.handle = MicroBatching(self, micro_batch_size=4)

        def initialize(self, ctx):
            super().initialize(ctx)
            self.handle.parallelism = {"preprocess": 2, "inference": 1, "postprocess": 2}

Each batch is split into micro-batches of ``micro_batch_size``; ``parallelism.preprocess``
micro-batches are prepared ahead in threads while inference runs (one at a time), and
``parallelism.postprocess`` threads finish them. A failed micro-batch fails only its own
requests. The same pipeline is what model-config.yaml's ``micro_batching`` section turns on
without code changes; when both are present, the section wins.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ferry.handlers.contract.context import Context

# The stage runner lives with the worker; this class only adapts TorchServe's API to it.
from ferry.worker.pipeline import PipelineSettings, StagePipeline

log = logging.getLogger("ferry.worker")

_STAGES = ("preprocess", "inference", "postprocess")


class MicroBatching:
    """Callable as ``handle(data, context)``; runs ``handler``'s three stages per micro-batch."""

    def __init__(
        self,
        parent_handler: Any,
        micro_batch_size: int = 1,
        parallelism: Mapping[str, int] | None = None,
    ) -> None:
        self.handler = parent_handler
        self._micro_batch_size = 1
        self._parallelism = dict.fromkeys(_STAGES, 1)
        self._pipeline: StagePipeline | None = None
        self.micro_batch_size = micro_batch_size
        if parallelism is not None:
            self.parallelism = parallelism

    @property
    def __self__(self) -> Any:
        """The handler, as a bound ``handle`` method would name it: the worker finds the
        handler's stages through this."""
        return self.handler

    @property
    def micro_batch_size(self) -> int:
        return self._micro_batch_size

    @micro_batch_size.setter
    def micro_batch_size(self, size: int) -> None:
        if int(size) < 1:
            raise ValueError(f"micro_batch_size must be at least 1, not {size}")
        self._micro_batch_size = int(size)

    @property
    def parallelism(self) -> dict[str, int]:
        """Workers per stage; a stage left out keeps its value."""
        return dict(self._parallelism)

    @parallelism.setter
    def parallelism(self, parallelism: Mapping[str, int]) -> None:
        unknown = set(parallelism) - set(_STAGES)
        if unknown:
            raise ValueError(f"parallelism: unknown stages {sorted(unknown)}; use {_STAGES}")
        for stage, count in parallelism.items():
            if int(count) < 1:
                raise ValueError(f"parallelism.{stage} must be at least 1, not {count}")
            self._parallelism[stage] = int(count)
        if self._parallelism["inference"] > 1:
            log.warning("MicroBatching: inference runs one micro-batch at a time")

    def settings(self) -> PipelineSettings:
        return PipelineSettings(
            self._micro_batch_size,
            self._parallelism["preprocess"],
            self._parallelism["postprocess"],
        )

    def __call__(self, data: list[Any], context: Context) -> list[Any]:
        """One answer per request, or an exception for those whose micro-batch failed."""
        settings = self.settings()
        if self._pipeline is None or self._pipeline.settings != settings:
            self.shutdown()
            self._pipeline = StagePipeline(self.handler, settings)
        return self._pipeline.handle(data, context)

    def shutdown(self) -> None:
        """Stop the pipeline's threads (a new call starts them again)."""
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
