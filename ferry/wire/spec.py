"""What a worker process is started with: the first frame it reads (``StartWorker``), its
fields as the dataclasses declare them (``ferry.wire.field_codec``).

Two parts: what the handler is loaded from (``HandlerSpec``), which is all that loading a
handler needs (``ferry.worker.loading.load_handler``, ``ferry bench profile``, the
benchmarks), and what the worker process is (``WorkerSpec``: its GPU, threads, id, process
group and weights keeper), which holds the first whole as ``WorkerSpec.model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ferry.config.image_limits import ImageLimits
from ferry.config.settings import TORCHSERVE_MODEL_METRICS, ModelMetric


@dataclass(frozen=True)
class HandlerSpec:
    """A model's handler as a process loads it: the fields of TorchServe's ``Context``
    and what Ferry adds around the handler."""

    model_name: str
    model_dir: str
    handler: str
    """The manifest's handler string (a module, a file, ``module:function``)."""
    manifest: dict[str, Any]
    batch_size: int
    model_yaml_config: dict[str, Any]
    image_limits: ImageLimits = field(default_factory=ImageLimits)
    """What the built-in vision handlers decode (the server's image settings)."""
    package_dirs: list[str] = field(default_factory=list)
    """Folders of the model's own packages, imported ahead of the server's."""
    envelope: str = ""
    """TorchServe's request envelope around the handler (``service_envelope``); "" for none."""
    model_metrics: tuple[ModelMetric, ...] = TORCHSERVE_MODEL_METRICS
    """The model metrics the handler finds declared (the server's ``metrics_config``)."""
    compile_cache: str = ""
    """The folder the model's workers share for compiled graphs
    (``ferry.worker.compile_cache``); "" for none."""


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process of a model: the handler it loads and where and how it runs."""

    model: HandlerSpec
    """The model's handler, loaded as it says. Named ``model``, not ``handler``: the
    handler string is ``HandlerSpec.handler``, read as ``spec.model.handler``."""
    gpu_id: int | None
    """The server's index of the GPU the worker runs on; None on CPUs."""
    torch_threads: int
    worker_id: str
    process_group: str = ""
    """The process group whose processes it shares with other models
    (``ferry.worker_handles.hosts``); "" for a process of its own."""
    weights_keeper: str = ""
    """The Unix socket of the weights keeper it imports its weights from
    (``ferry.handlers.builtin.kept_weights``); "" for none."""
