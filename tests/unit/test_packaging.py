"""What ``pip install ferry-serve`` promises: every module Ferry imports is declared; the server
package holds no bench code and runs without ferry-bench (the ``bench`` extra), and ``ferry
bench`` without it says what to install; ferry-bench (``bench/``) declares what it imports
and is released with ferry-serve at one version."""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ferry_bench
from ferry import __version__
from ferry.cli.bench import INSTALL_BENCH
from ferry.cli.main import main
from ferry_bench.cli import BENCH_EXTRA_MODULES, needing_bench_extra

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ferry"
BENCH = ROOT / "bench"
"""ferry-bench's distribution: its pyproject.toml and the package ferry_bench."""

DISTRIBUTION_OF = {
    "torch": "torch",
    "numpy": "numpy",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "msgpack": "msgpack",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "httptools": "httptools",
    "multipart": "python-multipart",
    "python_multipart": "python-multipart",
    "aiohttp": "aiohttp",
    "httpx": "httpx",
    "matplotlib": "matplotlib",
    "grpc": "grpcio",
    "ray": "ray",
    "opentelemetry": "opentelemetry-sdk",  # its api, sdk and exporters: the otel extra
    "google": "protobuf",  # google.protobuf; google.rpc comes with googleapis-common-protos
}
"""Import name -> the distribution that provides it (they differ: ``yaml`` is ``pyyaml``)."""

OPTIONAL_MODULES = {
    "torchvision",
    "captum",
    "onnxruntime",  # the onnx extra
    "pynvml",  # nvidia-ml-py
    "uvloop",  # with uvicorn[standard], but not on every platform
    "watchfiles",
    "nvidia",  # nvidia.dali: TorchServe's DALI handlers, where the user installed DALI
    "scipy",  # SageMaker's NPZ bodies (sagemaker_inference.decoder), where the model installs it
    "ferry_bench",  # ferry-bench, the bench extra: ferry/cli/bench.py adds its commands
}
"""Used when present: each import of one must sit in a ``try`` that catches ImportError."""

NOT_SERVER_CODE = ("_compat/", "grpc/", "ray_serve/", "tracing/otel.py")
"""The gRPC APIs, ``--ray`` and ``enable_tracing`` have their own extras; the TorchServe shim
only re-exports Ferry's handlers. (``ferry bench`` is not in the package at all.)"""

SERVER = frozenset({"ferry"})
BENCH_TOOL = frozenset({"ferry", "ferry_bench"})
"""The packages a distribution's code imports as its own: ferry-bench requires ferry-serve."""

_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def _project(folder: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    return project


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = _project(ROOT)
    base = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        extra: {_requirement_name(r) for r in requirements}
        for extra, requirements in project["optional-dependencies"].items()
    }
    return base, extras


def _imported_name(node: ast.AST) -> str | None:
    """The top-level module ``node`` imports: import statements and
    ``importlib.import_module("literal")``."""
    if isinstance(node, ast.Import):
        return node.names[0].name.partition(".")[0]
    if isinstance(node, ast.ImportFrom):
        return node.module.partition(".")[0] if node.level == 0 and node.module else None
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else None
        name = function.id if isinstance(function, ast.Name) else name
        if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
            return node.args[0].value.partition(".")[0]
    return None


def _catches_import_errors(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return caught is None or any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def third_party_imports(path: Path, own: frozenset[str]) -> Iterator[tuple[str, bool, int]]:
    """(module, guarded by ``except ImportError``, line) for each import outside the stdlib
    and the packages ``own``."""
    tree = ast.parse(path.read_text(), str(path))
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(map(_catches_import_errors, node.handlers)):
            guarded.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    for node in ast.walk(tree):
        name = _imported_name(node)
        if name and name not in own and name not in sys.stdlib_module_names:
            yield name, id(node) in guarded, getattr(node, "lineno", 0)


def _undeclared(files: list[Path], declared: set[str], own: frozenset[str] = SERVER) -> list[str]:
    problems = []
    for path in files:
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for module, guarded, line in third_party_imports(path, own):
            if module in OPTIONAL_MODULES:
                if not guarded:
                    problems.append(f"{where}:{line}: optional {module} is imported unguarded")
            elif DISTRIBUTION_OF.get(module) not in declared:
                problems.append(f"{where}:{line}: {module} is not a declared dependency")
    return problems


def _package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_server_imports_only_base_dependencies() -> None:
    base, _ = _declared()
    server = [
        p
        for p in _package_files()
        if not p.relative_to(PACKAGE).as_posix().startswith(NOT_SERVER_CODE)
    ]
    assert len(server) > 30  # the walk found the package
    assert _undeclared(server, base) == []


def test_the_server_package_holds_no_bench_code() -> None:
    """ferry_bench lives in bench/, ferry-bench's; the server's package never imports it:
    ``ferry bench`` finds its commands by the entry point ferry-bench declares."""
    assert not (PACKAGE / "bench").exists()
    assert (BENCH / "ferry_bench" / "cli.py").is_file()
    importing = [
        path.relative_to(ROOT).as_posix()
        for path in _package_files()
        if any(module == "ferry_bench" for module, _, _ in third_party_imports(path, SERVER))
    ]
    assert importing == []
    entry_points = _project(BENCH)["entry-points"]["ferry.commands"]
    assert entry_points == {"bench": "ferry_bench.cli:add_parser"}
    assert _packaged(ROOT, ["ferry", "ferry.cli", "ferry_bench", "ferry_bench.cli"]) == [
        "ferry",
        "ferry.cli",
    ]


def _packaged(folder: Path, packages: list[str]) -> list[str]:
    """Those of ``packages`` that ``folder``'s pyproject.toml has setuptools look for."""
    tool = tomllib.loads((folder / "pyproject.toml").read_text())["tool"]
    include: list[str] = tool["setuptools"]["packages"]["find"]["include"]
    return [name for name in packages if any(fnmatch.fnmatch(name, p) for p in include)]


def test_bench_imports_only_base_and_its_own_dependencies() -> None:
    base, extras = _declared()
    bench_declared = {_requirement_name(r) for r in _project(BENCH)["dependencies"]}
    package = BENCH / "ferry_bench"
    grpc_targets = package / "grpc_targets.py"  # reached only once grpc imports
    bench = sorted(package.rglob("*.py"))
    bench.remove(grpc_targets)
    assert _undeclared(bench, base | bench_declared, BENCH_TOOL) == []
    grpc_declared = base | bench_declared | extras["grpc"]
    assert _undeclared([grpc_targets], grpc_declared, BENCH_TOOL) == []
    assert set(BENCH_EXTRA_MODULES) <= bench_declared  # what the CLI tells users it installs
    assert _packaged(BENCH, ["ferry", "ferry_bench", "ferry_bench.commands"]) == [
        "ferry_bench",
        "ferry_bench.commands",
    ]


def test_ferry_bench_is_released_with_ferry_serve_at_one_version() -> None:
    """It drives the server's internals: the bench extra and ferry-bench pin each other."""
    server, bench = _project(ROOT), _project(BENCH)
    assert server["optional-dependencies"]["bench"] == [f"ferry-bench=={__version__}"]
    assert f"{server['name']}=={__version__}" in bench["dependencies"]
    assert ferry_bench.__version__ == __version__
    dynamic = tomllib.loads((BENCH / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert dynamic["dynamic"]["version"] == {"attr": "ferry_bench.__version__"}


def test_grpc_imports_only_base_and_grpc_dependencies() -> None:
    base, extras = _declared()
    grpc_code = [p for p in sorted((PACKAGE / "grpc").rglob("*.py")) if "generated" not in p.parts]
    assert _undeclared(grpc_code, base | extras["grpc"]) == []


def test_ray_serve_imports_only_base_and_ray_dependencies() -> None:
    base, extras = _declared()
    ray_code = sorted((PACKAGE / "ray_serve").rglob("*.py"))
    assert _undeclared(ray_code, base | extras["ray"]) == []


def test_tracing_imports_only_base_and_otel_dependencies() -> None:
    base, extras = _declared()
    assert _undeclared([PACKAGE / "tracing" / "otel.py"], base | extras["otel"]) == []


def test_the_base_install_is_lean() -> None:
    base, extras = _declared()
    assert base.isdisjoint({"aiohttp", "httpx", "matplotlib", "onnxruntime"})
    assert "onnxruntime" in extras["onnx"]


def test_a_missing_distribution_is_reported(tmp_path: Path) -> None:
    module = tmp_path / "uses_undeclared.py"
    module.write_text(
        "import httpx\n"
        "try:\n    import torchvision\nexcept ImportError:\n    pass\n"
        "import importlib\nimportlib.import_module('pynvml')\n"
    )
    assert _undeclared([module], {"torch"}) == [
        f"{module}:1: httpx is not a declared dependency",
        f"{module}:7: optional pynvml is imported unguarded",
    ]


BENCH_COMMANDS = {
    "load": [
        "load",
        "http://127.0.0.1:9/p/m",
        "--input",
        "x",
        "--concurrency",
        "1",
        "--requests=1",
    ],
    "profile": ["profile", "model.mar", "--input", "x"],
    "sweep": ["sweep", "spec.yaml"],
    "tune": ["tune", "model.mar", "--slo-p99", "100ms", "--input", "x"],
}


@pytest.mark.parametrize(
    ("tool", "missing", "reported"),
    [
        ("load", BENCH_EXTRA_MODULES, "aiohttp"),
        ("profile", BENCH_EXTRA_MODULES, "matplotlib"),
        ("sweep", BENCH_EXTRA_MODULES, "aiohttp"),
        ("tune", BENCH_EXTRA_MODULES, "aiohttp"),
        ("sweep", ("matplotlib",), "matplotlib"),
        ("tune", ("httpx",), "httpx"),
    ],
)
def test_bench_without_the_extra_says_what_to_install(
    tool: str,
    missing: tuple[str, ...],
    reported: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)  # import now raises ModuleNotFoundError
    assert main(["bench", *BENCH_COMMANDS[tool]]) == 2
    assert capsys.readouterr().err == (
        f"ferry bench {tool}: needs the 'bench' extra: pip install 'ferry-serve[bench]' "
        f"(missing module {reported})\n"
    )


def test_a_bench_module_missing_mid_command_is_reported_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def plots(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'matplotlib.pyplot'", name="matplotlib.pyplot")

    def other(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'scipy'", name="scipy")

    args = argparse.Namespace(tool="profile")
    assert needing_bench_extra(plots)(args) == 2
    assert "(missing module matplotlib)" in capsys.readouterr().err
    with pytest.raises(ModuleNotFoundError):  # not ours to explain
        needing_bench_extra(other)(args)


LEAN_PROCESS = """
import importlib, pkgutil, sys
import ferry


class Uninstalled:
    '''Finds none of the packages blocked, as when the bench extra is not installed.'''

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Uninstalled())
for module in pkgutil.walk_packages(ferry.__path__, "ferry."):
    if module.name != "ferry.__main__":
        importlib.import_module(module.name)
import ferry.cli.main
sys.exit(ferry.cli.main.main(["bench", *{argv!r}]))
"""


def test_the_server_runs_without_ferry_bench_and_bench_names_it() -> None:
    """In a fresh process, where nothing has imported ferry_bench or its dependencies: every
    module of the server imports, and ``ferry bench ...`` says in one line what to install."""
    blocked = ("ferry_bench", *BENCH_EXTRA_MODULES)
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            LEAN_PROCESS.format(blocked=blocked, argv=BENCH_COMMANDS["load"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        f"ferry bench: ferry-bench is not installed: {INSTALL_BENCH} "
        "(in a checkout of Ferry: pip install ./bench)"
    ]


def test_the_version_is_declared_once_and_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """The distribution's version is ``ferry.__version__`` (read by the build), which
    ``ferry --version`` prints."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ferry.__version__"}
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"ferry {__version__}\n"
