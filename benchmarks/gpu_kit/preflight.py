"""The kit's first part: is everything the other parts need here, and from where?

- versions: Python, torch and its CUDA, the GPU, and each package the parts import;
- each carried wheel is imported from the kit's private folder, not from elsewhere;
- each of Ferry's requirements and of a carried wheel's is met: by a carried wheel, or by
  a package on the device's list (``device_packages.txt``) installed at a version it
  accepts, so that a dry run here proves the set complete for the device as well;
- every module the parts import imports;
- ``ferry serve`` starts with no model on loopback ports and answers ``/ping``.

Prints its findings and writes them as a page; the last line is ``PASS: ...`` or
``FAIL: ...``. Run by the kit (``python -m benchmarks.gpu_kit``), not by hand.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

PART_MODULES = (
    "ferry.server",
    "ferry.cli.main",
    "ferry.http.protocol",
    "benchmarks.gpu_checks",
    "benchmarks.gpu_benchmark",
    "benchmarks.gpu_fault_load",
    "benchmarks.gpu_many_models",
    "benchmarks.gpu_pt2",
    "benchmarks.gpu_share",
)
"""What the parts import (and, through them, everything Ferry's server imports)."""
DEVICE_MODULES = ("torch", "numpy", "PIL", "yaml", "msgpack", "httpx", "aiohttp", "uvloop")
OPTIONAL_MODULES = {
    "torchvision": "gpu_decode (nvJPEG) is off without it",
    "pynvml": "no NVML figures without it (gpu_many_models SKIPs)",
    "onnxruntime": "the ONNX check SKIPs without it",
}
CARRIED_MODULES = {
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "httptools": "httptools",
    "python-multipart": "python_multipart",
}
"""The import name of each wheel the kit carries today (a new one must be added here)."""


def carried(site: Path) -> dict[str, str]:
    """Distribution name -> version of what the kit installed into ``site``."""
    from benchmarks.gpu_kit.wheels import canonical

    found = importlib.metadata.distributions(path=[str(site)])
    return {canonical(dist.metadata["Name"]): dist.version for dist in found}


def check_origins(site: Path, names: dict[str, str]) -> list[str]:
    problems = []
    for name in names:
        module_name = CARRIED_MODULES.get(name)
        if module_name is None:
            problems.append(f"{name} is carried but preflight does not know its module")
            continue
        module = importlib.import_module(module_name)
        origin = Path(module.__file__ or "").resolve()
        if site not in origin.parents:
            problems.append(f"{module_name} was imported from {origin}, not the kit's folder")
    return problems


def check_requirements(names: dict[str, str]) -> list[str]:
    """Ferry's requirements and each carried wheel's met: by a carried wheel, or by what
    is installed here and on the device's list (``names``: the carried wheels)."""
    from packaging.requirements import Requirement

    from benchmarks.gpu_kit.wheels import canonical, device_packages, ferry_requirements

    on_device = device_packages()
    needs = [("ferry", line) for line in ferry_requirements()]
    for name in names:
        needs += [(name, line) for line in importlib.metadata.distribution(name).requires or []]
    problems = []
    for needer, line in needs:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        needed = canonical(requirement.name)
        if needed in names:
            version = names[needed]
        elif needed not in on_device:
            problems.append(
                f"{needer} needs {needed}: the kit does not carry it, the device lacks it"
            )
            continue
        else:
            try:
                version = importlib.metadata.version(needed)
            except importlib.metadata.PackageNotFoundError:
                problems.append(f"{needer} needs {requirement}: not installed")
                continue
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{needer} needs {requirement}: {needed} {version} is here")
    return problems


def check_imports() -> tuple[list[str], list[str]]:
    """(problems, notes): a part's module that fails to import is a problem; an optional
    one missing is a note."""
    problems, notes = [], []
    for name in (*DEVICE_MODULES, *PART_MODULES):
        try:
            importlib.import_module(name)
        except Exception as error:  # report every failure, not the first
            problems.append(f"import {name}: {type(error).__name__}: {error}")
    for name, without in OPTIONAL_MODULES.items():
        try:
            importlib.import_module(name)
        except Exception as error:
            notes.append(f"{name} not importable ({type(error).__name__}): {without}")
    return problems, notes


def versions() -> list[str]:
    import torch

    lines = [f"Python {platform.python_version()} ({sys.executable})"]
    lines.append(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            memory = properties.total_memory / 2**30
            lines.append(f"GPU {index}: {properties.name}, {memory:.0f} GiB")
    else:
        lines.append("no CUDA GPU")
    packages = ["torchvision", "numpy", "pillow", "pyyaml", "msgpack", "anyio", "h11", "click"]
    packages += ["httpx", "aiohttp", "uvloop", "protobuf", "grpcio", "nvidia-ml-py", "onnxruntime"]
    found = []
    for package in packages:
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} (none)")
    return [*lines, ", ".join(found)]


def serve_once() -> str:
    """``ferry serve`` with no model: seconds until ready, and /ping's answer."""
    import httpx

    from benchmarks.server import ferry_server

    with tempfile.TemporaryDirectory(prefix="ferry-gpu-kit-serve-") as tmp:
        store = Path(tmp) / "store"
        store.mkdir()
        start = time.monotonic()
        with ferry_server(store, [], Path(tmp)) as server:
            ready = time.monotonic() - start
            answer = httpx.get(f"{server.url}/ping", timeout=30)
    if answer.status_code != 200:
        raise AssertionError(f"/ping answered {answer.status_code}: {answer.text[:200]}")
    return f"ferry serve ready in {ready:.1f} s, /ping {json.loads(answer.text)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, required=True, help="the kit's private folder")
    parser.add_argument("--out", type=Path, required=True, help="write the page here")
    args = parser.parse_args()
    site = args.site.resolve()
    lines = versions()
    names = carried(site)
    lines.append("carried: " + ", ".join(f"{n} {v}" for n, v in sorted(names.items())))
    problems = check_origins(site, names) + check_requirements(names)
    failed_imports, notes = check_imports()
    problems += failed_imports
    lines += [f"note: {note}" for note in notes]
    try:
        lines.append(serve_once())
    except Exception as error:
        problems.append(f"ferry serve: {type(error).__name__}: {error}")
    lines += [f"problem: {problem}" for problem in problems]
    verdict = f"FAIL: {len(problems)} problem(s), first: {problems[0]}" if problems else ""
    verdict = verdict or f"PASS: {len(names)} carried wheels, every part's modules import"
    page = ["# The GPU kit's preflight", "", *(f"- {line}" for line in lines), "", verdict]
    args.out.write_text("\n".join(page) + "\n")
    print("\n".join([*lines, verdict]), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
