"""``ferry serve --help`` as a newcomer reads it: every setting with its meaning and default."""

from __future__ import annotations

import pytest

from tests.fixtures.cli import run_ferry

pytestmark = pytest.mark.e2e


def test_serve_help_explains_the_settings() -> None:
    shown = run_ferry("serve", "--help", check=True).stdout
    text = " ".join(shown.split())
    for expected in (
        "Workers and batching:",
        "--job-queue-size N Requests a model version may hold waiting",
        "Default: 100.",
        "--default-response-timeout SECONDS Time a worker may take for one batch",
        "Default: 120 s.",
        "--enable-grpc [true|false]",
        "--access-log [true|false] One log line per inference request",
        "Default: http://127.0.0.1:8080.",
        "Default: 6553500 bytes.",
    ):
        assert expected in text, expected
    assert "FERRY_JOB_QUEUE_SIZE" in text  # the rule naming keys and variables


def test_a_misspelt_flag_is_refused_naming_the_close_one() -> None:
    done = run_ferry("serve", "--defualt-workers-per-model", "2")
    assert done.returncode == 2
    assert "did you mean '--default-workers-per-model'?" in done.stderr
