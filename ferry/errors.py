"""Ferry's domain errors. They name what went wrong, never an HTTP status.

One table, ``ferry.error_table``, gives each a row with a column per transport (HTTP
status, TorchServe error type, gRPC code), looked up by class hierarchy.

    FerryError
    ├── ModelNotFound          unknown model or version
    ├── RequestTooLarge        body over max_request_size
    ├── ResponseTooLarge       a handler's answer over max_response_size
    ├── InvalidInput           the request cannot be decoded (bad image, bad JSON)
    ├── Overloaded             the model's queue is full
    ├── ClientGone             the client hung up before its request reached a worker
    ├── NoWorkerAvailable      the model has no worker that could take the request
    ├── WorkerDied             the worker holding the request crashed (after one retry)
    ├── ResponseTimeout        the worker did not answer within responseTimeout
    ├── DeadlineExceeded       the request's own deadline (x-ferry-deadline-ms) cannot be
    │                          met: shed before it reached a worker
    ├── HandlerFailed          the handler raised; may carry the handler's own status code
    ├── SequenceEnded          a stateful sequence ended before the request ran, or is
    │                          ending (its client marked an earlier request as the last)
    ├── ArchiveError           an archive or model folder cannot be read
    │   ├── ArchiveNotFound    the model store has no such archive
    │   ├── ModelConfigError   its model-config.yaml (or a per-model override) is invalid;
    │   │                      also a ConfigError, so start-up stops with exit status 2
    │   └── PackageInstallFailed  pip could not install its requirements file
    ├── ConfigError            a setting is invalid
    ├── InvalidRequest         a management call with missing or invalid parameters
    ├── ModelAlreadyExists     that model version is already registered
    ├── ModelLoadFailed        registration failed: the model's workers could not load it
    ├── InsufficientMemory     a model cannot be loaded: it would not fit the memory
    │                          budget beside the models that must stay (SageMaker's 507)
    ├── ModelApiDisabled       register / unregister while enable_model_api is off
    ├── UrlNotAllowed          a remote archive URL that allowed_urls does not match
    ├── WorkflowNotFound       unknown workflow, or no such .war in the workflow store
    ├── WorkflowAlreadyExists  a workflow of that name is registered
    └── WorkflowRegistrationFailed  a node of the workflow could not be registered
    (InvalidRequest)
    └── InvalidWorkflow        the workflow spec or its DAG is invalid
"""

from __future__ import annotations


class FerryError(Exception):
    """Base of every error Ferry reports to a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelNotFound(FerryError):
    pass


class RequestTooLarge(FerryError):
    pass


class ResponseTooLarge(FerryError):
    pass


class InvalidInput(FerryError):
    pass


class Overloaded(FerryError):
    pass


class ClientGone(FerryError):
    pass


class NoWorkerAvailable(FerryError):
    pass


class WorkerDied(FerryError):
    pass


class ResponseTimeout(FerryError):
    pass


class DeadlineExceeded(FerryError):
    pass


class HandlerFailed(FerryError):
    """The handler raised. ``status`` is the code the handler asked for, if any
    (TorchServe's ``PredictionException(message, error_code)``)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SequenceEnded(FerryError):
    pass


class ArchiveError(FerryError):
    pass


class ArchiveNotFound(ArchiveError):
    """The model store has no such archive (404, as TorchServe answers)."""


class PackageInstallFailed(ArchiveError):
    """``install_py_dep_per_model``: pip could not install a model's requirements."""


class ConfigError(FerryError):
    pass


class ModelConfigError(ArchiveError, ConfigError):
    """model-config.yaml, or a per-model override, is invalid: registration answers 400,
    start-up stops as for any invalid setting."""


class InvalidRequest(FerryError):
    pass


class ModelAlreadyExists(FerryError):
    pass


class ModelLoadFailed(FerryError):
    def __init__(self, message: str, *, out_of_memory: bool = False) -> None:
        super().__init__(message)
        self.out_of_memory = out_of_memory
        """Every worker that failed ran out of memory while loading."""


class InsufficientMemory(FerryError):
    pass


class ModelApiDisabled(FerryError):
    pass


class UrlNotAllowed(FerryError):
    pass


class InvalidWorkflow(InvalidRequest):
    """A workflow spec, its DAG or its function nodes are invalid (400)."""


class WorkflowNotFound(FerryError):
    pass


class WorkflowAlreadyExists(FerryError):
    pass


class WorkflowRegistrationFailed(FerryError):
    """Some node of a workflow could not be registered; the others were rolled back."""
