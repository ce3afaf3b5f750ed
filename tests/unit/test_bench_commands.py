"""``ferry bench``'s command modules: each declares what the CLI needs, and the ``ferry``
command line, which adds them, loads none of the modules they drive."""

from __future__ import annotations

import subprocess
import sys

from ferry_bench.cli import BENCH_EXTRA_MODULES, COMMANDS


def test_every_command_needs_only_bench_extra_modules() -> None:
    assert list(COMMANDS) == ["load", "profile", "sweep", "limit", "tune"]
    for command in COMMANDS.values():
        assert command.HELP and set(command.NEEDS) <= set(BENCH_EXTRA_MODULES)


_IMPORTS = """
import sys
import ferry.cli.main
ferry.cli.main.build_parser()
print(",".join(sorted(m for m in sys.modules if m.startswith("ferry_bench"))))
"""


def test_the_cli_imports_only_the_command_modules_until_a_command_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORTS], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.strip().split(","))
    assert loaded == {"ferry_bench", "ferry_bench.cli", "ferry_bench.commands"} | {
        f"ferry_bench.commands.{name}" for name in (*COMMANDS, "arguments", "progress")
    }
