"""How each model version becomes a Ray Serve deployment: pure logic over its
model-config.yaml, no Ray import.

- Replicas stand for workers: each replica runs one Ferry worker, so ``minWorkers``
  replicas run, and with ``maxWorkers`` above it Ray Serve autoscales between the two on
  ongoing requests (``target_ongoing_requests``: one batch per replica).
- A replica asks Ray for one CPU, and one GPU when ``deviceType`` is ``gpu``.
- A ``ray:`` section in model-config.yaml overrides any of it with Ray Serve's own keys:
  ``num_replicas``, ``autoscaling_config``, ``ray_actor_options``, ``max_ongoing_requests``.
- Each deployment is the ingress of a Ray Serve application of its own, whose route prefix
  is TorchServe's prediction path of the model version (``direct_route``): Ray's ingress
  sends those requests straight to the model's replicas, with no router between.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from ferry.config.model_config import ModelConfig
from ferry.errors import ModelConfigError
from ferry.scheduling.runner_settings import startup_timeout

_PLAIN = re.compile(r"^[A-Za-z0-9._~-]+$")
RAY_KEYS = ("num_replicas", "autoscaling_config", "ray_actor_options", "max_ongoing_requests")
THROUGHPUT_ENVIRONMENT = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
}
"""The part of Ray Serve's throughput-optimised mode (``RAY_SERVE_THROUGHPUT_OPTIMIZED``)
that Ferry turns on in the processes it deploys (replicas, the router, and the proxy when
it starts Serve): a deployment's code and its handles' routing run on the process's own
event loop rather than on loops in threads of their own, which cost every request
hand-overs between threads and the GIL between loops (Ferry's service never blocks its
loop: handlers run in worker processes or on a thread of their own); and requests travel
from the proxy and the router to replicas over gRPC rather than as Ray actor calls.
A model's ``ray_actor_options.runtime_env.env_vars`` override them for its replicas.
Left off: direct ingress (each replica an HTTP server on ports of its own, for HAProxy)."""


HANDLER_IN_REPLICA_ENVIRONMENT = {
    **THROUGHPUT_ENVIRONMENT,
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1",
}
"""``THROUGHPUT_ENVIRONMENT`` for replicas that run their handler on a thread of their own
process (``ray_handler_in_replica``): the replica's code keeps its loop thread. On the
main loop, which Ray's own request handling keeps busy, the handler thread waited for the
GIL after every batch (no-op: 193 requests/s against 340)."""


def with_replica_environment(
    actor_options: dict[str, Any], environment: dict[str, str] = THROUGHPUT_ENVIRONMENT
) -> dict[str, Any]:
    """``actor_options`` with ``environment`` under the model's own variables."""
    runtime_env = dict(actor_options.get("runtime_env") or {})
    runtime_env["env_vars"] = {**environment, **(runtime_env.get("env_vars") or {})}
    return {**actor_options, "runtime_env": runtime_env}


@dataclass(frozen=True)
class DeploymentPlan:
    name: str
    version: str
    entry: str
    """The ``load_models`` entry each replica loads (``NAME=ARCHIVE``)."""
    num_replicas: int | None
    """Fixed replica count; None when autoscaling."""
    autoscaling: dict[str, Any] | None
    actor_options: dict[str, Any]
    max_ongoing_requests: int
    """Requests Ray sends one replica at once: Ferry's own queue takes the rest of the
    load's shape (batches, 503 when full), so this is its queue plus a batch."""
    batch_size: int
    max_batch_delay_ms: float
    response_timeout: float = 120.0
    startup_timeout: float = 120.0
    batch_policy: str = "adaptive"
    client_timeout_ms: float | None = None
    deadline_action: str = "reject"

    @property
    def deployment(self) -> str:
        """The Ray deployment name: the model and version, in Ray's allowed characters."""
        return re.sub(r"[^A-Za-z0-9_-]", "_", f"{self.name}_v{self.version}")

    @property
    def application(self) -> str:
        """The Ray Serve application whose ingress the deployment is."""
        return f"ferry_{self.deployment}"

    def direct_route(self, default_version: str | None) -> str | None:
        """The route prefix on Ray's ingress that reaches this deployment with no router:
        ``/predictions/NAME`` for the model's default version (its other versions' paths
        under it too, unless one has a route of its own: the longest prefix wins), else
        ``/predictions/NAME/VERSION``. None when a name or version is not plain path text
        (it would reach the replicas percent-encoded): then only the router reaches it."""
        if not all(_PLAIN.match(part) and part.strip(".") for part in (self.name, self.version)):
            return None
        base = f"/predictions/{self.name}"
        return base if self.version == default_version else f"{base}/{self.version}"

    def options(self, environment: dict[str, str] = THROUGHPUT_ENVIRONMENT) -> dict[str, Any]:
        """Keyword arguments of Ray Serve's ``Deployment.options``; ``environment``: Ray's
        settings in its replicas."""
        options: dict[str, Any] = {
            "name": self.deployment,
            "ray_actor_options": with_replica_environment(self.actor_options, environment),
            "max_ongoing_requests": self.max_ongoing_requests,
        }
        if self.autoscaling is not None:
            options["autoscaling_config"] = dict(self.autoscaling)
        else:
            options["num_replicas"] = self.num_replicas
        return options

    def scaled(self, min_replicas: int, max_replicas: int | None = None) -> DeploymentPlan:
        """The management API's scale call: ``min_worker`` / ``max_worker`` as replicas."""
        top = max(max_replicas or min_replicas, min_replicas)
        if top > min_replicas:
            autoscaling = {**(self.autoscaling or {}), "min_replicas": min_replicas}
            autoscaling["max_replicas"] = top
            autoscaling.setdefault("target_ongoing_requests", self.batch_size)
            return replace(self, num_replicas=None, autoscaling=autoscaling)
        return replace(self, num_replicas=min_replicas, autoscaling=None)


POOL_DEPLOYMENT = "ferry_model_pool"


@dataclass(frozen=True)
class PoolPlan:
    """The deployment that multiplexes the models loaded on demand (``ferry.ray_serve.pool``)."""

    members: tuple[DeploymentPlan, ...]
    """Its model versions, each as a deployment of its own would be (their batch and
    time settings, for describe)."""
    num_replicas: int
    models_per_replica: int
    max_ongoing_requests: int
    actor_options: dict[str, Any]

    @property
    def deployment(self) -> str:
        return POOL_DEPLOYMENT

    @property
    def entries(self) -> tuple[str, ...]:
        """The ``load_models`` entries of its models (``NAME=ARCHIVE``)."""
        return tuple(member.entry for member in self.members)

    @property
    def keys(self) -> tuple[str, ...]:
        """Its model versions, as ``model/version``."""
        return tuple(f"{member.name}/{member.version}" for member in self.members)

    def member(self, key: str) -> DeploymentPlan:
        return self.members[self.keys.index(key)]

    def options(self, environment: dict[str, str] = THROUGHPUT_ENVIRONMENT) -> dict[str, Any]:
        return {
            "name": self.deployment,
            "num_replicas": self.num_replicas,
            "ray_actor_options": with_replica_environment(self.actor_options, environment),
            "max_ongoing_requests": self.max_ongoing_requests,
        }


def pool_plan(
    models: list[DeploymentPlan], *, replicas: int, models_per_replica: int, queue_size: int
) -> PoolPlan | None:
    """The pool of ``models``, None without any."""
    if not models:
        return None
    return PoolPlan(
        members=tuple(models),
        num_replicas=replicas,
        models_per_replica=models_per_replica,
        max_ongoing_requests=queue_size,
        # A replica may hold any of them: it asks for what the most demanding one asks.
        actor_options={
            "num_cpus": max(m.actor_options.get("num_cpus", 1) for m in models),
            "num_gpus": max(m.actor_options.get("num_gpus", 0) for m in models),
        },
    )


def plan_for(
    entry: str,
    name: str,
    version: str,
    config: ModelConfig,
    *,
    queue_size: int,
    default_batch_size: int,
    default_max_batch_delay_ms: float,
    default_response_timeout: float = 120.0,
) -> DeploymentPlan:
    """The deployment of one model version; ``ModelConfigError`` for a bad ``ray:``."""
    section = _ray_section(config, name)
    batch_size = config.batch_size or default_batch_size
    delay = (
        config.max_batch_delay_ms
        if config.max_batch_delay_ms is not None
        else default_max_batch_delay_ms
    )
    low = 1 if config.min_workers is None else config.min_workers
    high = max(config.max_workers or low, low)
    plan = DeploymentPlan(
        name=name,
        version=version,
        entry=entry,
        num_replicas=low,
        autoscaling=None,
        actor_options={"num_cpus": 1, "num_gpus": 1 if config.device_type == "gpu" else 0},
        max_ongoing_requests=(config.job_queue_size or queue_size) + batch_size,
        batch_size=batch_size,
        max_batch_delay_ms=delay,
        response_timeout=config.response_timeout or default_response_timeout,
        startup_timeout=startup_timeout(config, None),
        batch_policy=config.batch_policy or "adaptive",
        client_timeout_ms=config.client_timeout_ms,
        deadline_action=config.deadline_action or "reject",
    )
    if high > low:
        plan = plan.scaled(low, high)
    if "autoscaling_config" in section:
        plan = replace(plan, num_replicas=None, autoscaling=dict(section["autoscaling_config"]))
    elif "num_replicas" in section:
        plan = replace(plan, num_replicas=section["num_replicas"], autoscaling=None)
    if "ray_actor_options" in section:
        plan = replace(plan, actor_options={**plan.actor_options, **section["ray_actor_options"]})
    if "max_ongoing_requests" in section:
        plan = replace(plan, max_ongoing_requests=section["max_ongoing_requests"])
    return plan


def _ray_section(config: ModelConfig, name: str) -> dict[str, Any]:
    section = config.raw.get("ray") or {}
    where = f"model {name}: model-config.yaml ray"
    if not isinstance(section, dict):
        raise ModelConfigError(f"{where}: expected a mapping of {', '.join(RAY_KEYS)}")
    unknown = sorted(set(section) - set(RAY_KEYS))
    if unknown:
        raise ModelConfigError(
            f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(RAY_KEYS)}"
        )
    count = section.get("num_replicas")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        raise ModelConfigError(f"{where}.num_replicas: expected a whole number >= 0")
    for key in ("autoscaling_config", "ray_actor_options"):
        if key in section and not isinstance(section[key], dict):
            raise ModelConfigError(f"{where}.{key}: expected a mapping (Ray Serve's keys)")
    ongoing = section.get("max_ongoing_requests")
    if ongoing is not None and (not isinstance(ongoing, int) or ongoing < 1):
        raise ModelConfigError(f"{where}.max_ongoing_requests: expected a whole number >= 1")
    return section
