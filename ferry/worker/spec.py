"""What a worker process is started with (JSON on its command line)."""

from __future__ import annotations

import json
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

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))
