"""``ferry.http.protocol`` subclasses uvicorn's httptools protocol, which is not a public
API: pyproject.toml bounds uvicorn above, and these tests fail loudly, naming what moved,
when the installed uvicorn is outside that bound or lacks what the subclass relies on.
(``test_http_protocol`` checks the behaviour; these say why it would break.)"""

from __future__ import annotations

import inspect
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from uvicorn.protocols.http import httptools_impl
from uvicorn.server import ServerState

from tests.unit.test_http_protocol import Connection, ok_app

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"

OVERRIDDEN = {
    "__init__": ["config", "server_state", "app_state", "_loop"],
    "connection_made": ["transport"],
    "connection_lost": ["exc"],
    "data_received": ["data"],
    "on_headers_complete": [],
    "on_body": ["body"],
    "on_message_complete": [],
    "send_400_response": ["msg"],
}
"""The methods ``LimitedHttpProtocol`` overrides, with their parameters (after self)."""

READ = ("parser", "flow", "cycle", "server_state", "transport", "headers", "logger", "loop")
"""Attributes of a connected protocol that ``LimitedHttpProtocol`` reads."""


def _uvicorn_requirement() -> Requirement:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    found = [Requirement(d) for d in project["dependencies"] if d.startswith("uvicorn")]
    assert len(found) == 1, "pyproject.toml should name uvicorn once"
    return found[0]


def test_pyproject_bounds_uvicorn_above_and_the_installed_one_is_within() -> None:
    requirement = _uvicorn_requirement()
    assert any(spec.operator in ("<", "<=") for spec in requirement.specifier), (
        "ferry/http/protocol.py subclasses uvicorn internals: keep an upper bound on uvicorn"
    )
    installed = metadata.version("uvicorn")
    assert requirement.specifier.contains(installed), (
        f"uvicorn {installed} is outside {requirement.specifier}, the versions "
        "ferry/http/protocol.py was checked against: run tests/unit/test_http_protocol.py "
        "and this file against it, then move the bound"
    )


def test_the_methods_the_subclass_overrides_keep_their_parameters() -> None:
    base = httptools_impl.HttpToolsProtocol
    for name, expected in OVERRIDDEN.items():
        method = getattr(base, name, None)
        assert method is not None, f"uvicorn's HttpToolsProtocol has no {name} any more"
        parameters = list(inspect.signature(method).parameters)[1:]
        assert parameters == expected, f"HttpToolsProtocol.{name} now takes {parameters}"


def test_a_connected_protocol_has_what_the_subclass_reads() -> None:
    assert isinstance(httptools_impl.STATUS_LINE, dict) and 400 in httptools_impl.STATUS_LINE
    assert hasattr(ServerState(), "default_headers")
    connection = Connection(ok_app)
    try:
        missing = [name for name in READ if not hasattr(connection.protocol, name)]
        assert not missing, f"uvicorn's HttpToolsProtocol no longer sets {missing}"
        assert hasattr(connection.protocol.flow, "read_paused")
        assert hasattr(connection.protocol.parser, "feed_data")
    finally:
        connection.close()
