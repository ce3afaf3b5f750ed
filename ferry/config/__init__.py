"""Typed settings: one server model, one per-model model; readers fill them."""

from ferry.config.model_config import ModelConfig, load_model_config
from ferry.config.settings import ServerSettings, default_workers_per_model, threads_per_worker

__all__ = [
    "ModelConfig",
    "ServerSettings",
    "default_workers_per_model",
    "load_model_config",
    "threads_per_worker",
]
