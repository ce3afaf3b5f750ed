"""``ferry.tracing.otel`` sends requests Ferry encoded through OpenTelemetry's OTLP
exporters by way of their private members (not a public API): pyproject.toml bounds the
SDK and exporters above, and these tests fail loudly, naming what moved, when the installed
ones are outside that bound or lack what Ferry relies on. (``test_tracing`` checks the
behaviour; these say why it would break.)"""

from __future__ import annotations

import inspect
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from packaging.requirements import Requirement

from ferry.tracing import otel

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"

OTEL_PACKAGES = (
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry-exporter-otlp-proto-http",
)

GRPC_METHODS = {
    "_export": ["data"],
    "_translate_data": ["data"],
    "_count_data": ["data"],
    "_initialize_channel_and_stub": [],
}
"""The gRPC exporter's methods Ferry's subclass calls or overrides, with their parameters."""


def _otel_requirements() -> dict[str, Requirement]:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    requirements = [Requirement(line) for line in extras["otel"]]
    return {requirement.name: requirement for requirement in requirements}


@pytest.mark.parametrize("package", OTEL_PACKAGES)
def test_pyproject_bounds_the_otel_extra_above_and_the_installed_one_is_within(
    package: str,
) -> None:
    requirement = _otel_requirements()[package]
    assert any(spec.operator in ("<", "<=") for spec in requirement.specifier), (
        f"ferry/tracing/otel.py relies on {package}'s private members: keep an upper bound"
    )
    installed = metadata.version(package)
    assert requirement.specifier.contains(installed), (
        f"{package} {installed} is outside {requirement.specifier}, the versions "
        "ferry/tracing/otel.py was checked against: run tests/unit/test_tracing.py and this "
        "file against it, then move the bound"
    )


@pytest.mark.parametrize(("name", "parameters"), GRPC_METHODS.items())
def test_the_grpc_exporter_keeps_the_methods_ferry_relies_on(
    name: str, parameters: list[str]
) -> None:
    method = getattr(GrpcSpanExporter, name, None)
    assert callable(method), f"OTLP gRPC exporter has no {name} any more"
    found = list(inspect.signature(method).parameters)[1:]
    assert found == parameters, f"OTLP gRPC exporter's {name} now takes {found}"


def test_a_grpc_exporter_has_the_channel_and_stub_ferry_replaces() -> None:
    exporter = GrpcSpanExporter()
    try:
        assert hasattr(exporter, "_channel"), "OTLP gRPC exporter keeps no _channel"
        assert hasattr(exporter, "_client"), "OTLP gRPC exporter keeps no _client stub"
    finally:
        exporter.shutdown()


def test_an_http_exporter_sends_bytes_through_its_client() -> None:
    exporter = HttpSpanExporter()
    try:
        assert exporter._shutdown is False, "OTLP HTTP exporter keeps no _shutdown flag"
        export = getattr(getattr(exporter, "_client", None), "export", None)
        assert callable(export), "OTLP HTTP exporter's _client has no export"
        assert list(inspect.signature(export).parameters) == ["data"]
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_ferrys_exporters_find_the_hooks_and_send_ferrys_encoding(protocol: str) -> None:
    exporter = otel._otlp_exporter(protocol)
    try:
        assert getattr(exporter, "encodes", False), (
            f"Ferry's OTLP/{protocol} exporter found no hook to send its own encoding: spans "
            "would be parsed back into the SDK's messages first"
        )
    finally:
        exporter.shutdown()
