"""The batch policies' registry (``ferry.batching.registry``): a policy with a
parameter registered in one place is accepted by model-config.yaml and config.properties,
listed by the management API's description and ``ferry bench limit``, built with its
options by the runner, switched to through the management call and kept by snapshots; a
stateful model refuses a policy that says it cannot batch sequences."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest

from ferry.batching.policies import Decision, ImmediatePolicy, QueueState
from ferry.batching.registry import (
    BATCH_POLICIES,
    LATENCY_OBJECTIVE,
    PolicyKind,
    PolicyOption,
)
from ferry.capacity.sizing import Machine
from ferry.config.model_config import apply_overrides, parse_model_config
from ferry.config.settings import ServerSettings
from ferry.errors import InvalidRequest, ModelConfigError
from ferry.http.management import _policy_options
from ferry.http.openapi import management_description
from ferry.http.params import Params
from ferry.scheduling.model_runner import ModelRunner, RunnerSettings
from ferry.scheduling.runner_settings import runner_settings
from ferry.scheduling.sequences import SequenceSettings
from ferry.service.snapshots import ServerSnapshot, VersionSnapshot, to_properties
from ferry_bench.commands import limit
from tests.fixtures.fake_worker import FakeFactory, spec


class EveryNthPolicy:
    """A batch goes once ``every`` requests are queued (or it is full)."""

    name = "every_nth"

    def __init__(self, every: int) -> None:
        self.every = every

    def arrived(self, now: float) -> None:
        pass

    def decide(self, state: QueueState) -> Decision:
        go = state.queued >= min(self.every, state.batch_size)
        return Decision(dispatch=go, reason="every_nth" if go else "")

    def describe(self, now: float) -> dict[str, Any]:
        return {"policy": self.name, "everyRequests": self.every}


EVERY = PolicyOption("everyRequests", "requests a batch waits for", minimum=1, integer=True)


@pytest.fixture
def every_nth() -> Iterator[PolicyKind]:
    kind = PolicyKind(
        "every_nth",
        lambda options: EveryNthPolicy(options.get(EVERY.key, 2)),
        "waits for everyRequests requests",
        options=(EVERY,),
        serves_sequences=False,
    )
    BATCH_POLICIES.register(kind)
    try:
        yield kind
    finally:
        BATCH_POLICIES.unregister(kind.name)


def _settings(**overrides: Any) -> RunnerSettings:
    values: dict[str, Any] = {
        "batch_size": 8,
        "max_batch_delay": 0.05,
        "workers": 0,
        "response_timeout": 5.0,
        "startup_timeout": 5.0,
        "queue_capacity": 10,
        "torch_threads": 1,
    }
    return RunnerSettings(**{**values, **overrides})


def _runner(settings: RunnerSettings) -> ModelRunner:
    return ModelRunner("m", "1.0", spec("m"), settings, FakeFactory(), None)


STATEFUL = SequenceSettings(max_sequences=8, queue_size=1, max_idle=1.0)


def test_a_policy_registered_once_is_accepted_by_model_config(every_nth: PolicyKind) -> None:
    document = {"batchPolicy": "every_nth", "everyRequests": 3}
    config = parse_model_config(document, source="model-config.yaml")
    assert config.batch_policy == "every_nth"
    assert config.batch_policy_options == {"everyRequests": 3}
    assert config.warnings == ()  # its option is a known key, not a typo
    with pytest.raises(ModelConfigError, match="everyRequests: must be at least 1, got 0"):
        parse_model_config({"everyRequests": 0}, source="model-config.yaml")
    overridden = apply_overrides(config, {"everyRequests": 5}, source="config.properties")
    assert overridden.batch_policy_options == {"everyRequests": 5}


def test_a_policy_registered_once_is_listed_by_describe_and_bench(every_nth: PolicyKind) -> None:
    put = management_description()["paths"]["/models/{model_name}"]["put"]
    by_name = {param["name"]: param for param in put["parameters"]}
    assert by_name["batch_policy"]["schema"]["enum"] == [
        "adaptive",
        "immediate",
        "fixed_window",
        "every_nth",
    ]
    assert "every_nth: waits for everyRequests" in by_name["batch_policy"]["description"]
    assert {"latency_objective_ms", "every_requests"} <= set(by_name)
    parser = argparse.ArgumentParser()
    limit.add_arguments(parser)
    required = ["m.mar", "--input", "x", "--slo-p99", "1s"]
    chosen = parser.parse_args([*required, "--batch-policy", "every_nth"])
    assert chosen.batch_policy == "every_nth"  # ferry bench limit offers it


def test_the_runner_builds_it_with_its_options_and_switches_to_it(every_nth: PolicyKind) -> None:
    config = parse_model_config(
        {"batchPolicy": "every_nth", "everyRequests": 3}, source="model-config.yaml"
    )
    settings = runner_settings(config, ServerSettings(), Machine(1, 0), gpu_ids=())
    runner = _runner(settings)
    assert runner.queue.describe()["everyRequests"] == 3
    runner.set_batch_policy("immediate", {})
    assert isinstance(runner.queue.policy, ImmediatePolicy)
    options = _policy_options(Params({"every_requests": "4"}))  # PUT ...&every_requests=4
    runner.set_batch_policy("every_nth", options)
    assert runner.queue.describe()["everyRequests"] == 4
    snapshot = VersionSnapshot(
        "m", "1.0", "m.mar", True, 0, 0, 8, 50.0, 5.0,
        batch_policy=runner.settings.batch_policy,
        batch_policy_options=runner.settings.batch_policy_options,
    )  # fmt: skip
    written = to_properties(ServerSnapshot(None, (snapshot,)))["models"]
    assert '"batchPolicy": "every_nth"' in written and '"everyRequests": 4' in written


def test_the_management_call_reads_options_as_model_config_does() -> None:
    assert _policy_options(Params({"latency_objective_ms": "80"})) == {"latencyObjectiveMs": 80.0}
    with pytest.raises(InvalidRequest, match="latency_objective_ms: expected a number, got 'soon'"):
        _policy_options(Params({"latency_objective_ms": "soon"}))
    assert LATENCY_OBJECTIVE.param == "latency_objective_ms"


def test_a_stateful_model_refuses_a_policy_that_cannot_batch_sequences(
    every_nth: PolicyKind,
) -> None:
    document = {"sequenceBatching": True, "sequenceMaxIdleMSec": 1000, "batchPolicy": "every_nth"}
    with pytest.raises(ModelConfigError, match="every_nth cannot batch a stateful model"):
        parse_model_config(document, source="model-config.yaml")
    stateful = parse_model_config(
        {"sequenceBatching": True, "sequenceMaxIdleMSec": 1000}, source="model-config.yaml"
    )
    kept = apply_overrides(stateful, {"batchSize": 2}, source="config.properties")
    assert kept.sequence_batching  # an override that does not name it keeps it
    with pytest.raises(ModelConfigError, match="every_nth cannot batch a stateful model"):
        apply_overrides(stateful, {"batchPolicy": "every_nth"}, source="config.properties")
    with pytest.raises(ValueError, match="every_nth' cannot batch a stateful model"):
        _runner(_settings(sequences=STATEFUL, batch_policy="every_nth"))
    runner = _runner(_settings(sequences=STATEFUL))
    with pytest.raises(ValueError, match="every_nth' cannot batch a stateful model"):
        runner.set_batch_policy("every_nth", {})
    assert runner.settings.batch_policy == "adaptive"  # unchanged
    assert _runner(_settings(batch_policy="every_nth")).settings.batch_policy == "every_nth"


def test_whether_sequences_wait_is_the_policys_own_word() -> None:
    waiting = PolicyKind("waits", lambda options: ImmediatePolicy(), "", sequences_wait=True)
    BATCH_POLICIES.register(waiting)
    try:
        runner = _runner(_settings(sequences=STATEFUL, batch_policy="waits"))
        assert runner.sequences is not None and runner.sequences.wait_for_more
        runner.set_batch_policy("adaptive", {})
        assert not runner.sequences.wait_for_more
        runner.set_batch_policy("fixed_window", {})
        assert runner.sequences.wait_for_more
    finally:
        BATCH_POLICIES.unregister("waits")


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="'adaptive' is already registered"):
        BATCH_POLICIES.register(PolicyKind("adaptive", lambda options: ImmediatePolicy(), ""))
