"""The transport-neutral data plane: every HTTP (or later gRPC) adapter calls this.

It owns the registry of model versions and knows nothing about HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ferry.config.settings import ServerSettings, available_cores, default_workers_per_model
from ferry.config.settings import threads_per_worker as split_threads
from ferry.errors import ConfigError, ModelNotFound
from ferry.scheduling.jobs import InferenceResponse, Job, next_request_id
from ferry.scheduling.model_runner import ModelRunner, RunnerSettings
from ferry.store.archive import ModelArchive, open_model, resolve_model_entries
from ferry.worker.messages import InputPart, RequestItem
from ferry.worker.spec import WorkerSpec

log = logging.getLogger("ferry.service")


@dataclass
class RegisteredModel:
    versions: dict[str, ModelRunner] = field(default_factory=dict)
    default_version: str = ""


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class FerryService:
    """Predict, health and model loading, independent of any transport."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.models: dict[str, RegisteredModel] = {}
        self._work_dir = tempfile.TemporaryDirectory(prefix="ferry-models-")
        self._gpus = _visible_gpus()

    # --- models --------------------------------------------------------------------------

    def _runner_settings(self, archive: ModelArchive) -> RunnerSettings:
        config, settings = archive.config, self.settings
        cores = available_cores()
        workers = config.min_workers
        if workers is None:
            workers = settings.default_workers_per_model or default_workers_per_model(
                cores, self._gpus
            )
        use_gpu = self._gpus > 0 and config.device_type != "cpu"
        gpu_ids = (config.device_ids or tuple(range(self._gpus))) if use_gpu else ()
        delay_ms = config.max_batch_delay_ms
        return RunnerSettings(
            batch_size=config.batch_size or settings.default_batch_size,
            max_batch_delay=(
                delay_ms if delay_ms is not None else settings.default_max_batch_delay_ms
            )
            / 1000,
            workers=workers,
            response_timeout=config.response_timeout or settings.default_response_timeout,
            startup_timeout=max(120.0, config.response_timeout or 0.0),
            queue_capacity=settings.job_queue_size,
            torch_threads=split_threads(cores, workers),
            gpu_ids=gpu_ids,
        )

    async def load_model(self, archive: ModelArchive) -> ModelRunner:
        """Start the model's workers and wait until each has tried to load."""
        registered = self.models.setdefault(archive.name, RegisteredModel())
        if archive.version in registered.versions:
            raise ConfigError(f"model {archive.name} version {archive.version} is already loaded")
        runner_settings = self._runner_settings(archive)
        spec = WorkerSpec(
            model_name=archive.name,
            model_dir=str(archive.model_dir),
            handler=archive.manifest.handler,
            manifest=archive.manifest.document,
            batch_size=runner_settings.batch_size,
            gpu_id=None,
            model_yaml_config=archive.config.raw,
            torch_threads=runner_settings.torch_threads,
            worker_id="w0",
        )
        runner = ModelRunner(archive.name, archive.version, spec, runner_settings)
        registered.versions[archive.version] = runner
        registered.default_version = registered.default_version or archive.version
        runner.start()
        await runner.wait_started()
        log.info(
            "model %s v%s: %d/%d workers ready, batch_size %d, max_batch_delay %.0f ms, "
            "%d torch threads per worker",
            archive.name,
            archive.version,
            runner.ready_workers,
            len(runner.slots),
            runner_settings.batch_size,
            runner_settings.max_batch_delay * 1000,
            runner_settings.torch_threads,
        )
        return runner

    async def load_startup_models(self) -> None:
        store, entries = self.settings.model_store, self.settings.models
        if not entries:
            return
        if store is None:
            raise ConfigError("--models needs --model-store")
        work_dir = Path(self._work_dir.name)
        archives = [
            open_model(store, relative, work_dir, name)
            for name, relative in resolve_model_entries(store, entries)
        ]
        await asyncio.gather(*(self.load_model(archive) for archive in archives))

    def runner(self, model: str, version: str | None = None) -> ModelRunner:
        registered = self.models.get(model)
        if registered is None:
            raise ModelNotFound(f"Model not found: {model}")
        runner = registered.versions.get(version or registered.default_version)
        if runner is None:
            raise ModelNotFound(f"Model version not found: {model} version {version}")
        return runner

    # --- data plane ----------------------------------------------------------------------

    async def predict(
        self, model: str, version: str | None, parts: list[InputPart], headers: dict[str, str]
    ) -> InferenceResponse:
        runner = self.runner(model, version)
        loop = asyncio.get_running_loop()
        job = Job(RequestItem(next_request_id(), headers, parts), loop.create_future())
        runner.submit(job)
        return await job.future

    def is_healthy(self) -> bool:
        """True when every model version has its minimum workers ready."""
        return all(
            runner.is_healthy()
            for registered in self.models.values()
            for runner in registered.versions.values()
        )

    async def close(self) -> None:
        runners = [r for reg in self.models.values() for r in reg.versions.values()]
        await asyncio.gather(*(runner.stop() for runner in runners))
        self._work_dir.cleanup()


__all__ = ["FerryService"]
