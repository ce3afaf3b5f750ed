"""The wheels the kit carries: what Ferry needs that the device lacks, pinned and complete.

The set is derived, not listed: Ferry's runtime requirements (``pyproject.toml``'s
dependencies and ferry-bench's, in ``bench/pyproject.toml``, which the parts use) less what
the device already has (``device_packages.txt``), each pinned to the version this
checkout's environment runs, then the same for every requirement of a carried wheel
(markers evaluated for the device's Python), until nothing is missing. Extras of a
requirement are not followed: ``uvicorn[standard]`` would bring websockets, watchfiles and
python-dotenv, which Ferry never imports (it names httptools itself; uvloop is on the
device).

``build`` runs here (it needs ``packaging`` and a package index); ``install`` and
``read_manifest`` run on the device before anything is installed, so they use only the
standard library.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE_PACKAGES = Path(__file__).with_name("device_packages.txt")
MANIFEST = "manifest.json"
DEVICE_PYTHON = "3.12"
DEVICE_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
"""Tags pip matches exactly: the newest glibc baseline first (the device's is newer)."""
DEVICE_MARKERS = {
    "python_version": DEVICE_PYTHON,
    "python_full_version": f"{DEVICE_PYTHON}.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
SIZE_LIMIT = 16 * 2**20
"""The kit's own ceiling, well under the 64 MiB the tree and carried folders may take."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    file: str
    size: int
    sha256: str


def canonical(name: str) -> str:
    """PyPI's normalised name: ``Typing_Extensions`` -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages() -> set[str]:
    lines = DEVICE_PACKAGES.read_text().splitlines()
    return {canonical(line) for line in lines if line.strip() and not line.startswith("#")}


def ferry_requirements() -> list[str]:
    """Ferry's runtime requirements and ferry-bench's (its ``bench`` extra), as
    ``pyproject.toml`` and ``bench/pyproject.toml`` say; not ferry-serve itself, which runs
    from the checkout."""
    from packaging.requirements import Requirement

    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bench = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())["project"]
    ours = canonical(server["name"])
    from_bench = [
        line for line in bench["dependencies"] if canonical(Requirement(line).name) != ours
    ]
    requirements: list[str] = [*server["dependencies"], *from_bench]
    return requirements


def requirement_names(requirements: list[str], markers: dict[str, str]) -> list[str]:
    """The names of ``requirements`` that apply under ``markers`` (extras not followed)."""
    from packaging.requirements import Requirement

    names = []
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({**markers, "extra": ""}):
            names.append(canonical(requirement.name))
    return names


def wheel_requirements(path: Path) -> list[str]:
    """A wheel's ``Requires-Dist`` lines."""
    with zipfile.ZipFile(path) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    header = text.split("\n\n", 1)[0]
    return [
        line.split(":", 1)[1].strip()
        for line in header.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def download(
    pins: list[str], folder: Path, *, for_device: bool, timeout: float | None = None
) -> None:
    """``pip download`` binary wheels of ``pins`` (``name==version``), no dependencies:
    for the device's Python and platform, or for this interpreter."""
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    argv += ["--only-binary=:all:", "--dest", str(folder)]
    if for_device:
        argv += ["--python-version", DEVICE_PYTHON, "--implementation", "cp"]
        for platform in DEVICE_PLATFORMS:
            argv += ["--platform", platform]
    subprocess.run([*argv, *pins], check=True, timeout=timeout)


def build(kit: Path) -> list[Wheel]:
    """Fill ``kit/wheels`` with the closure of what the device lacks; write the manifest."""
    wheels = kit / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for stale in wheels.glob("*.whl"):
        stale.unlink()
    present = device_packages()
    carried: dict[str, str] = {}
    wanted = [name for name in requirement_names(ferry_requirements(), DEVICE_MARKERS)]
    while missing := sorted({n for n in wanted if n not in present and n not in carried}):
        pins = {name: importlib.metadata.version(name) for name in missing}
        download([f"{name}=={version}" for name, version in pins.items()], wheels, for_device=True)
        carried.update(pins)
        wanted = [
            requirement
            for name in missing
            for requirement in requirement_names(
                wheel_requirements(_wheel_file(wheels, name)), DEVICE_MARKERS
            )
        ]
    found = [
        describe(_wheel_file(wheels, name), name, version) for name, version in carried.items()
    ]
    total = sum(wheel.size for wheel in found)
    if total > SIZE_LIMIT:
        raise SystemExit(f"the kit's wheels take {total / 2**20:.1f} MiB, over its 16 MiB")
    manifest = {"python": DEVICE_PYTHON, "wheels": [asdict(wheel) for wheel in found]}
    (kit / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return found


def _wheel_file(folder: Path, name: str) -> Path:
    matches = [p for p in folder.glob("*.whl") if canonical(p.name.split("-")[0]) == name]
    if len(matches) != 1:
        raise SystemExit(f"expected one wheel of {name} in {folder}, found {matches}")
    return matches[0]


def describe(path: Path, name: str, version: str) -> Wheel:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return Wheel(name, version, path.name, path.stat().st_size, digest)


def read_manifest(kit: Path) -> list[Wheel]:
    """The kit's wheels, each checked present and unchanged."""
    entries = json.loads((kit / MANIFEST).read_text())["wheels"]
    wheels = [Wheel(**entry) for entry in entries]
    for wheel in wheels:
        path = kit / "wheels" / wheel.file
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != wheel.sha256:
            raise SystemExit(f"{path} is missing or changed: run `make gpu-kit` again")
    return wheels


def install(wheel_files: list[Path], site: Path, timeout: float | None = None) -> None:
    """Install into the private folder ``site``, from these files alone."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    argv += ["--no-compile", "--no-cache-dir", "--disable-pip-version-check"]
    argv += ["--target", str(site), *map(str, wheel_files)]
    subprocess.run(argv, check=True, timeout=timeout)
