"""``ferry serve --ray`` turns Ray's colour codes and log deduplication off before anything
imports Ray, which reads both switches once, at its import (``ray_constants``). Looking
for ``ray.serve`` (``ferry.ray_serve.available``) imports ``ray`` itself: set after that
look, the switches came too late, and Ray's coloured "[repeated 2x across cluster]" notes
reached Ferry's log whenever two replicas logged the same line (a flaky e2e failure)."""

from __future__ import annotations

import os

import pytest

from ferry.config.settings import ServerSettings
from ferry.errors import ConfigError
from ferry.ray_serve import app


def test_rays_log_switches_are_set_before_anything_looks_for_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unset_and_restored(monkeypatch, *app.RAY_PLAIN_LOG_VARIABLES)
    seen: dict[str, str | None] = {}

    def available() -> bool:  # where Ray would be imported first
        seen.update(
            {variable: os.environ.get(variable) for variable in app.RAY_PLAIN_LOG_VARIABLES}
        )
        return False

    monkeypatch.setattr(app, "available", available)
    with pytest.raises(ConfigError, match="--ray needs Ray Serve"):
        app.run_on_ray(ServerSettings(), None)
    assert seen == {"RAY_COLOR_PREFIX": "0", "RAY_DEDUP_LOGS": "0"}


def test_an_operators_own_choice_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_DEDUP_LOGS", "1")
    _unset_and_restored(monkeypatch, "RAY_COLOR_PREFIX")
    monkeypatch.setattr(app, "available", lambda: False)
    with pytest.raises(ConfigError):
        app.run_on_ray(ServerSettings(), None)
    assert os.environ["RAY_DEDUP_LOGS"] == "1" and os.environ["RAY_COLOR_PREFIX"] == "0"


def _unset_and_restored(monkeypatch: pytest.MonkeyPatch, *variables: str) -> None:
    """``variables`` unset for the test, and as they were after it, whatever ``run_on_ray``
    sets: ``delenv`` of an unset variable records nothing to undo, so each is set first."""
    for variable in variables:
        monkeypatch.setenv(variable, "set by the test")
        monkeypatch.delenv(variable)
