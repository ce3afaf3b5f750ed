"""``model-config.yaml``: per-model settings in TorchServe's keys, and the sections Ferry
owns (``ferry.config.sections``), parsed and validated once, when the archive is opened.

A document over 1 MiB, or one whose YAML aliases expand it beyond that, is refused before
it is built: ``safe_load`` of a few hundred bytes of nested aliases is megabytes of data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ferry.batching.registry import BATCH_POLICIES, PolicyOption
from ferry.config.sections import (
    HANDLER_SECTIONS,
    ImageTransformConfig,
    MicroBatchingConfig,
    OptimizationConfig,
    Reader,
    boolean,
    choice,
    group_name,
    integer,
    integers,
    number,
    parse_micro_batching,
    parse_optimization,
    read_section,
)
from ferry.errors import ModelConfigError
from ferry.suggest import did_you_mean

log = logging.getLogger("ferry.config")

MAX_DOCUMENT_BYTES = 1 << 20
"""The largest model-config.yaml, and the most it may expand to through aliases."""


def batch_policy_name(value: Any, where: str) -> str:
    """A policy ``BATCH_POLICIES`` declares, as registered now."""
    read: Reader = choice(*BATCH_POLICIES.names())
    return str(read(value, where))


def read_policy_option(option: PolicyOption, value: Any, where: str) -> float | int:
    """A batch policy's option, read as this module reads its own numbers."""
    if option.integer:
        low = int(option.minimum) + (1 if option.above_minimum else 0)
        return int(integer(low)(value, where))
    return float(number(option.minimum, above_low=option.above_minimum)(value, where))


_KNOWN_KEYS: dict[str, tuple[str, Reader]] = {
    "minWorkers": ("min_workers", integer(0)),
    "maxWorkers": ("max_workers", integer(0)),
    "batchSize": ("batch_size", integer(1)),
    "maxBatchDelay": ("max_batch_delay_ms", number(0.0)),
    "responseTimeout": ("response_timeout", number(0.0, above_low=True)),
    "deviceType": ("device_type", choice("cpu", "gpu")),
    "deviceIds": ("device_ids", integers(0, scalar=True)),
    "maxRequestsPerWorker": ("max_requests_per_worker", integer(1)),
    "maxWorkerMemoryMB": ("max_worker_memory_mb", integer(1)),
    "jobQueueSize": ("job_queue_size", integer(1)),
    "startupTimeout": ("startup_timeout", number(0.0, above_low=True)),
    "batchPolicy": ("batch_policy", batch_policy_name),
    "clientTimeoutInMills": ("client_timeout_ms", number(0.0, above_low=True)),
    "deadlineAction": ("deadline_action", choice("reject", "delay")),
    "sequenceBatching": ("sequence_batching", boolean),
    "maxNumSequence": ("max_num_sequence", integer(1)),
    "maxSequenceJobQueueSize": ("max_sequence_job_queue_size", integer(1)),
    "sequenceMaxIdleMSec": ("sequence_max_idle_ms", number(0.0)),
    "sequenceTimeoutMSec": ("sequence_timeout_ms", number(0.0)),
    "processGroup": ("process_group", group_name),
    "loadOnDemand": ("load_on_demand", boolean),
}

TORCHSERVE_ONLY_KEYS = (
    "parallelType",
    "parallelLevel",
    "torchrun",
    "maxRetryTimeoutInSec",
    "useJobTicket",
    "continuousBatching",
    "asyncCommunication",
    "useVenv",
)
"""TorchServe's other top-level keys (its ``ModelConfig.java``): Ferry does not read them,
but they are no typos either."""

SECTION_KEYS = ("micro_batching", "optimization", "pt2", *HANDLER_SECTIONS)
"""The top-level sections Ferry reads."""


@dataclass(frozen=True)
class ModelConfig:
    """Per-model settings. ``None`` means "use the server default"."""

    min_workers: int | None = None
    max_workers: int | None = None
    batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    response_timeout: float | None = None
    device_type: str | None = None
    """``cpu`` or ``gpu``; absent means a GPU when one is visible."""
    device_ids: tuple[int, ...] = ()
    max_requests_per_worker: int | None = None
    """Ferry: replace a worker (between batches) once it has answered this many requests."""
    max_worker_memory_mb: int | None = None
    """Ferry: replace a worker (between batches) once its resident memory exceeds this."""
    job_queue_size: int | None = None
    """Requests this model version may hold waiting (the server's ``job_queue_size``
    when None)."""
    startup_timeout: float | None = None
    """Seconds a worker may take to load the model (TorchServe's ``startupTimeout``)."""
    batch_policy: str | None = None
    """Ferry: a policy of ``ferry.batching.registry`` (``adaptive``, the default,
    ``immediate`` or ``fixed_window``)."""
    batch_policy_options: Mapping[str, Any] = field(default_factory=dict)
    """The policies' own top-level keys the document sets (``latencyObjectiveMs``: the
    adaptive policy never holds a request so long that it would miss it), read."""
    client_timeout_ms: float | None = None
    """TorchServe's ``clientTimeoutInMills``: every request's deadline unless it brings
    its own (``x-ferry-deadline-ms``); TorchServe drops such requests silently, Ferry
    answers them ``DeadlineExceeded``."""
    deadline_action: str | None = None
    """Ferry, after Triton's queue policy ``timeout_action``: ``reject`` (the default)
    answers a request that misses its deadline ``DeadlineExceeded``; ``delay`` keeps it,
    behind every request that can still be on time."""
    sequence_batching: bool = False
    """TorchServe's ``sequenceBatching``: a stateful model, whose requests run in order
    per sequence (``ferry.scheduling.sequences``)."""
    max_num_sequence: int | None = None
    """Sequences open at once (``maxNumSequence``; at least batchSize times workers)."""
    max_sequence_job_queue_size: int | None = None
    """Requests one sequence may hold waiting (``maxSequenceJobQueueSize``, 1 if unset)."""
    sequence_max_idle_ms: float | None = None
    """How long a sequence may wait for its next request (``sequenceMaxIdleMSec``)."""
    sequence_timeout_ms: float | None = None
    """After this, a sequence ends at its first idle moment (``sequenceTimeoutMSec``)."""
    process_group: str | None = None
    """Ferry: share worker processes with the other models of this group (one torch
    runtime for all of them: ``ferry.worker_handles.hosts``); None: the server's
    ``share_worker_processes`` decides."""
    load_on_demand: bool | None = None
    """Ferry: no workers until the first request, evictable under the memory budget
    (``ferry.scheduling.residency``); False pins it resident; None: the server's
    ``load_models_on_demand``."""
    micro_batching: MicroBatchingConfig | None = None
    """The stage pipeline; None: batches run through the handler whole."""
    optimization: OptimizationConfig = field(default_factory=OptimizationConfig)
    handler_sections: Mapping[str, ImageTransformConfig] = field(default_factory=dict)
    """The built-in handlers' sections present in the document (``image_classifier`` ...)."""
    raw: dict[str, Any] = field(default_factory=dict)
    """The whole YAML document; handlers read it as ``context.model_yaml_config``."""
    warnings: tuple[str, ...] = ()
    """Top-level keys that look like misspelt known ones (``misspelt_keys``): ``ferry
    archive`` prints them, ``ferry serve`` logs them when it opens the archive."""

    def merged(self, **overrides: Any) -> ModelConfig:
        values = {k: v for k, v in overrides.items() if v is not None}
        return ModelConfig(**{**self.__dict__, **values})

    @property
    def sets_workers(self) -> bool:
        """TorchServe's rule for who sets a model's workers: the archive's ``minWorkers``
        and ``maxWorkers`` win over every other source (registration's
        ``initial_workers``, config.properties' ``models``, ``default_workers_per_model``)
        when both are given, ``minWorkers`` above 0 and ``maxWorkers`` at least as
        large; otherwise the other source decides."""
        low, high = self.min_workers, self.max_workers
        return low is not None and low > 0 and high is not None and high >= low


def parse_model_config(document: dict[str, Any], *, source: str) -> ModelConfig:
    """Every key Ferry reads, validated; errors name the key (``source: optimization:
    precision: ...``). Unknown top-level keys are left to handlers."""
    values: dict[str, Any] = {
        attr: read(document[key], f"{source}: {key}")
        for key, (attr, read) in _KNOWN_KEYS.items()
        if key in document
    }
    if values.get("sequence_batching") and not values.get("sequence_max_idle_ms"):
        raise ModelConfigError(
            f"{source}: sequenceBatching: true needs sequenceMaxIdleMSec above 0 (how long "
            "a sequence may wait for its next request before it ends)"
        )
    check_sequence_policy(values.get("batch_policy"), values.get("sequence_batching"), source)
    options = {
        option.key: read_policy_option(option, document[option.key], f"{source}: {option.key}")
        for option in BATCH_POLICIES.options()
        if option.key in document
    }
    sections = {
        name: read_section(kind, document[name], f"{source}: {name}")
        for name, kind in HANDLER_SECTIONS.items()
        if name in document
    }
    return ModelConfig(
        **values,
        batch_policy_options=options,
        micro_batching=parse_micro_batching(
            document.get("micro_batching"), f"{source}: micro_batching"
        ),
        optimization=parse_optimization(document.get("optimization"), f"{source}: optimization"),
        handler_sections=sections,
        raw=dict(document),
        warnings=misspelt_keys(document, source),
    )


def check_sequence_policy(policy: str | None, stateful: bool | None, source: str) -> None:
    """A stateful model refuses a policy that says it cannot batch sequences."""
    if stateful and policy and not BATCH_POLICIES.kind(policy).serves_sequences:
        raise ModelConfigError(
            f"{source}: batchPolicy: {policy} cannot batch a stateful model's sequences "
            "(sequenceBatching: true)"
        )


def misspelt_keys(document: Mapping[Any, Any], source: str) -> tuple[str, ...]:
    """A warning for each unknown top-level key close to a known one (``batchSzie``).

    As in TorchServe, unknown top-level keys go to the handler (``model_yaml_config``), so
    they cannot be errors; but one a letter or two away from a key Ferry or TorchServe
    reads is almost surely a typo, and ignored it would leave the model at that setting's
    default. Keys unlike any known one (a handler's own) pass silently.
    """
    known = (*_KNOWN_KEYS, *_policy_keys(), *TORCHSERVE_ONLY_KEYS, *SECTION_KEYS)
    found = []
    for key in document:
        if not isinstance(key, str) or key in known:
            continue
        hint = did_you_mean(key, known)
        if hint:
            found.append(
                f"{source}: unknown top-level key {key!r}{hint}; Ferry ignores it "
                "(only the handler sees it)"
            )
    return tuple(found)


def _policy_keys() -> tuple[str, ...]:
    return tuple(option.key for option in BATCH_POLICIES.options())


def load_model_config(path: Path) -> ModelConfig:
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise ModelConfigError(f"{path.name}: {size} bytes; at most 1 MiB is accepted")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"cannot read {path.name}: {exc}") from exc
    document = load_yaml(text, path.name) or {}
    if not isinstance(document, dict):
        raise ModelConfigError(f"{path.name}: expected a mapping at the top level")
    try:
        json.dumps(document)  # it travels to the workers: plain data only
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(
            f"{path.name}: only strings, numbers, booleans, lists and mappings are "
            f"supported ({exc})"
        ) from exc
    return parse_model_config(document, source=path.name)


def load_yaml(text: str, name: str) -> Any:
    """``yaml.safe_load``, refusing documents that aliases expand beyond the size limit."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, set()) > MAX_DOCUMENT_BYTES:
            raise ModelConfigError(
                f"{name}: YAML aliases expand the document beyond 1 MiB; write the values out"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ModelConfigError(f"cannot read {name}: {exc}") from exc
    except RecursionError:
        raise ModelConfigError(f"{name}: nested too deeply") from None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """About how many characters ``node`` is once every alias is written out. Aliases
    share their anchor's node, so each node is measured once."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        return MAX_DOCUMENT_BYTES + 1  # an alias inside its own anchor: endless
    open_nodes.add(key)
    if isinstance(node, yaml.ScalarNode):
        size = 1 + len(node.value)
    elif isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, sizes, open_nodes) for child in node.value)
    else:
        size = 1 + sum(
            _expanded_size(k, sizes, open_nodes) + _expanded_size(v, sizes, open_nodes)
            for k, v in node.value
        )
    open_nodes.discard(key)
    sizes[key] = size
    return size


WORKER_KEYS = ("minWorkers", "maxWorkers")
MODELS_JSON_ONLY_KEYS = frozenset({"marName", "defaultVersion"})
"""Keys of config.properties' ``models`` JSON that are not model-config.yaml keys."""


def apply_overrides(config: ModelConfig, overrides: dict[str, Any], *, source: str) -> ModelConfig:
    """config.properties' per-version settings win over the archive's model-config.yaml,
    except its workers where the archive sets them (``ModelConfig.sets_workers``, as in
    TorchServe); they are validated by the same rules."""
    readable = (*_KNOWN_KEYS, *_policy_keys())
    known = {key: value for key, value in overrides.items() if key in readable}
    others = {k: v for k, v in overrides.items() if k not in MODELS_JSON_ONLY_KEYS}
    for warning in misspelt_keys(others, source):  # config.properties' typos too
        log.warning("%s", warning.replace("Ferry ignores it (only the handler sees it)", "ignored"))
    if config.sets_workers:
        known = {key: value for key, value in known.items() if key not in WORKER_KEYS}
    parsed = parse_model_config(known, source=source)
    # Only the keys given: a field's default (sequenceBatching's false) is no override.
    merged = config.merged(
        **{attr: getattr(parsed, attr) for key, (attr, _) in _KNOWN_KEYS.items() if key in known},
        batch_policy_options={**config.batch_policy_options, **parsed.batch_policy_options},
    )
    check_sequence_policy(merged.batch_policy, merged.sequence_batching, source)
    return merged
