"""A feature whose extra is not installed says which to install, in one line.

Each case runs the CLI in a Python whose import system cannot find one module (a finder
first on ``sys.meta_path`` refuses it), as if the extra that brings it were not
installed. Issue 47, item 8: ``--enable-tracing true`` without the ``otel`` extra printed
a 30-line traceback (``No module named 'opentelemetry'``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.cli import serve_args
from tests.fixtures.models import DEMO_STORE

pytestmark = pytest.mark.e2e

WITHOUT_MODULE = """
import sys

missing = sys.argv[1]


class Uninstalled:
    '''Finds nothing of the package ``missing``, as when it is not installed.'''

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == missing:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Uninstalled())
from ferry.cli.main import main

sys.exit(main(sys.argv[2:]))
"""


def _ferry_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``ferry ARGS`` in a Python that cannot import ``module``."""
    command = [sys.executable, "-c", WITHOUT_MODULE, module, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _tune_args() -> list[str]:
    samples = DEMO_STORE.parent / "samples"
    model = str(DEMO_STORE / "shapes.mar")
    return ["bench", "tune", model, "--slo-p99", "50ms", "--input", str(samples / "star.png")]


@pytest.mark.parametrize(
    ("module", "extra", "command"),
    [
        ("opentelemetry", "otel", ["--enable-tracing", "true"]),
        ("grpc", "grpc", ["--enable-grpc", "true"]),
        ("ray", "ray", ["--ray"]),
        ("matplotlib", "bench", None),
        ("ferry_bench", "bench", None),  # ferry-bench, the bench extra, not installed at all
    ],
)
def test_a_missing_extra_is_named_in_one_line(
    tmp_path: Path, module: str, extra: str, command: list[str] | None
) -> None:
    if command is None:
        args = _tune_args()
    else:
        args = serve_args(tmp_path, "--disable-token-auth", *command)
    result = _ferry_without(module, *args)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    hint = f"pip install 'ferry-serve[{extra}]'"
    assert len([line for line in output.splitlines() if hint in line]) == 1, output
