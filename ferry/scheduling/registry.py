"""Which model versions exist, which is each model's default, and lookups by name."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ferry.config.image_limits import ImageLimits
from ferry.config.settings import ServerSettings
from ferry.errors import InvalidRequest, ModelAlreadyExists, ModelNotFound
from ferry.metrics.definitions import ModelMetrics
from ferry.scheduling.model_runner import ModelRunner, RunnerSettings
from ferry.scheduling.observers import Observer
from ferry.store.archive import ModelArchive
from ferry.suggest import close_matches
from ferry.wire.spec import HandlerSpec, WorkerSpec
from ferry.worker_handles.handle import WorkerFactory


@dataclass
class ModelVersion:
    archive: ModelArchive
    runner: ModelRunner
    loaded_at_startup: bool

    @classmethod
    def serving(
        cls,
        archive: ModelArchive,
        settings: RunnerSettings,
        server: ServerSettings,
        start_worker: WorkerFactory,
        metrics: ModelMetrics,
        *,
        at_startup: bool,
        observer: Observer | None = None,
    ) -> ModelVersion:
        """The version with its runner, whose workers (not started yet) run the archive's
        handler as ``settings`` and the server's image and envelope settings say;
        ``observer`` watches its requests (``ferry.scheduling.observers``)."""
        spec = WorkerSpec(
            model=_handler_spec(archive, settings, server),
            gpu_id=None,
            torch_threads=settings.torch_threads,
            worker_id="w0",
            process_group=settings.process_group,
        )
        runner = ModelRunner(
            archive.name, archive.version, spec, settings, start_worker, metrics, observer=observer
        )
        return cls(archive, runner, at_startup)


def _handler_spec(
    archive: ModelArchive, settings: RunnerSettings, server: ServerSettings
) -> HandlerSpec:
    """The archive's handler as its workers load it, with the server's image, envelope
    and metrics settings."""
    return HandlerSpec(
        model_name=archive.name,
        model_dir=str(archive.model_dir),
        handler=archive.manifest.handler,
        manifest=archive.manifest.document,
        batch_size=settings.batch_size,
        model_yaml_config=archive.config.raw,
        image_limits=ImageLimits(server.limit_max_image_pixels, server.allowed_image_formats),
        package_dirs=[str(archive.packages)] if archive.packages else [],
        envelope=server.service_envelope,
        model_metrics=server.model_metrics,
        compile_cache=str(archive.compile_cache) if archive.compile_cache else "",
    )


@dataclass
class RegisteredModel:
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    default_version: str = ""


class ModelRegistry:
    def __init__(self) -> None:
        self._models: dict[str, RegisteredModel] = {}

    def names(self) -> list[str]:
        return sorted(self._models)

    def all_versions(self) -> list[ModelVersion]:
        return [v for model in self._models.values() for v in model.versions.values()]

    def add(self, version: ModelVersion) -> None:
        """Register a version; the first version of a model becomes its default."""
        archive = version.archive
        model = self._models.setdefault(archive.name, RegisteredModel())
        if archive.version in model.versions:
            raise ModelAlreadyExists(
                f"Model version {archive.version} is already registered for model {archive.name}"
            )
        model.versions[archive.version] = version
        model.default_version = model.default_version or archive.version

    def remove(self, name: str, version: str | None) -> ModelVersion:
        """Unregister a version (the default when None); the default can go only if alone."""
        model = self._model(name)
        entry = self.get(name, version)
        key = entry.archive.version
        if key == model.default_version and len(model.versions) > 1:
            raise InvalidRequest(
                f"cannot unregister the default version {key} of model {name} while other "
                "versions exist; set another default first"
            )
        del model.versions[key]
        if not model.versions:
            del self._models[name]
        return entry

    def set_default(self, name: str, version: str) -> None:
        self._model(name).default_version = self.get(name, version).archive.version

    def default_version(self, name: str) -> str:
        return self._model(name).default_version

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        model = self._model(name)
        entry = model.versions.get(version or model.default_version)
        if entry is None:
            raise ModelNotFound(f"Model version not found: {name} version {version}")
        return entry

    def versions_of(self, name: str) -> list[ModelVersion]:
        return list(self._model(name).versions.values())

    def _model(self, name: str) -> RegisteredModel:
        model = self._models.get(name)
        if model is None:
            raise model_not_found(name, self._models)
        return model


def model_not_found(name: str, known: Iterable[str]) -> ModelNotFound:
    """TorchServe's ``Model not found: NAME``, naming up to three registered models that
    look like ``name`` (a misspelt request), never the others: every transport answers
    with this message (404, gRPC ``NOT_FOUND``)::

        Model not found: tinyst (did you mean 'tiny'?)
    """
    close = [repr(match) for match in close_matches(name, known, limit=3)]
    if not close:
        return ModelNotFound(f"Model not found: {name}")
    names = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
    return ModelNotFound(f"Model not found: {name} (did you mean {names}?)")
