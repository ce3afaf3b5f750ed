"""What a worker process is started with: the first frame it reads (``StartWorker``), its
fields as the dataclass declares them (``ferry.wire.field_codec``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ferry.config.image_limits import ImageLimits
from ferry.config.settings import TORCHSERVE_MODEL_METRICS, ModelMetric


@dataclass(frozen=True)
class WorkerSpec:
    model_name: str
    model_dir: str
    handler: str
    manifest: dict[str, Any]
    batch_size: int
    gpu_id: int | None
    model_yaml_config: dict[str, Any]
    torch_threads: int
    worker_id: str
    image_limits: ImageLimits = field(default_factory=ImageLimits)
    """What the built-in vision handlers decode (the server's image settings)."""
    package_dirs: list[str] = field(default_factory=list)
    """Folders of the model's own packages, imported ahead of the server's."""
    envelope: str = ""
    """TorchServe's request envelope around the handler (``service_envelope``); "" for none."""
    model_metrics: tuple[ModelMetric, ...] = TORCHSERVE_MODEL_METRICS
    """The model metrics the handler finds declared (the server's ``metrics_config``)."""
    process_group: str = ""
    """The process group whose processes it shares with other models
    (``ferry.worker_handles.hosts``); "" for a process of its own."""
    compile_cache: str = ""
    """The folder the model's workers share for compiled graphs
    (``ferry.worker.compile_cache``); "" for none."""
    weights_keeper: str = ""
    """The Unix socket of the weights keeper it imports its weights from
    (``ferry.handlers.builtin.kept_weights``); "" for none."""
