"""What a worker process is started with: the first frame it reads (``StartWorker``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> WorkerSpec:
        return cls(**document)
