"""AOTInductor packages: a ``.pt2`` holding a model compiled ahead of time to native kernels
(``torch._inductor.aoti_compile_and_package``), loaded with ``aoti_load_package``: no
Python model code and no compilation at serving time.

A ``.pt2`` file is either such a package or a ``torch.export`` program; the package is
told by its contents (``data/aotinductor/``). Before loading, the package's own metadata
is checked against the worker: the device type it was compiled for, the CPU instruction
set of its kernels (a CPU package built for AVX-512 would crash an AVX2 machine; the CPU's
flags are read, not probed), the GPU
compute capability, and the torch version (recorded by ``ferry archive --aot-inductor``;
native kernels are tied to the libtorch that built them). A mismatch is an
``ArchiveError`` naming both sides, not a crash.

Torch: ``aoti_load_package`` is torch 2.6's; on an older torch loading a package is an
``ArchiveError`` naming the torch it needs (a package cannot be served any other way),
and where the loader takes no ``device_index`` (before 2.7) the package is loaded with
the worker's GPU made current instead.

Batches: a package compiled with a dynamic batch dimension runs any batch size up to its
maximum (``ferry.max_batch`` in its metadata); a larger batch is run in slices of that
size and joined, so ``batchSize`` above the compiled maximum still works.
"""

from __future__ import annotations

import inspect
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ferry.errors import ArchiveError
from ferry.handlers.builtin.vector_isa import vector_isa_from_cpu_flags

AOTI_FOLDER = "data/aotinductor/"
"""Where a ``.pt2`` archive keeps AOTInductor's compiled models."""
TORCH_KEY = "ferry.torch"
MAX_BATCH_KEY = "ferry.max_batch"
"""Ferry's entries in a package's metadata (``aot_inductor.metadata``)."""


@dataclass(frozen=True)
class PackageTarget:
    """What a package was compiled for, from its metadata."""

    device_type: str
    """``cpu`` or ``cuda`` (AOTInductor's ``AOTI_DEVICE_KEY``)."""
    cpu_isa: str = ""
    """The vector instruction set of CPU kernels (``AOTI_CPU_ISA``), "" if unrecorded."""
    compute_capability: str = ""
    """The GPU's compute capability (``AOTI_COMPUTE_CAPABILITY``), "" if unrecorded."""
    torch_version: str = ""
    """The torch that compiled it (recorded by ``ferry archive``), "" if unrecorded."""
    max_batch: int | None = None
    """The largest batch its dynamic batch dimension takes; None if unrecorded."""


def is_aoti_package(path: Path) -> bool:
    """Whether ``path`` is a ``.pt2`` archive holding AOTInductor models."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(AOTI_FOLDER in name for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def package_target(path: Path) -> PackageTarget:
    """The target recorded in the package's metadata (``*_metadata.json`` beside its
    compiled model); ``ArchiveError`` if it has none."""
    with zipfile.ZipFile(path) as archive:
        names = [
            name
            for name in archive.namelist()
            if AOTI_FOLDER in name and name.endswith("_metadata.json")
        ]
        if not names:
            raise ArchiveError(f"{path.name}: an AOTInductor package without its metadata")
        metadata = json.loads(archive.read(sorted(names)[0]))
    if not isinstance(metadata, dict) or "AOTI_DEVICE_KEY" not in metadata:
        raise ArchiveError(f"{path.name}: its metadata does not say which device it is for")
    max_batch = metadata.get(MAX_BATCH_KEY)
    return PackageTarget(
        device_type=str(metadata["AOTI_DEVICE_KEY"]),
        cpu_isa=str(metadata.get("AOTI_CPU_ISA", "")),
        compute_capability=str(metadata.get("AOTI_COMPUTE_CAPABILITY", "")),
        torch_version=str(metadata.get(TORCH_KEY, "")),
        max_batch=int(max_batch) if max_batch else None,
    )


ISA_FLAGS = {
    "AVX2": ("avx2", "fma", "f16c"),
    "AVX512": ("avx512f", "avx512dq", "avx512vl", "avx512bw", "fma"),
    "AVX512_VNNI": ("avx512_vnni",),
    "AMX_TILE": ("amx_tile", "amx_bf16", "amx_int8"),
}
"""The CPU flags (as Linux lists them) that Inductor's x86 instruction sets compile for
(its ``-m`` options); other sets are not checked."""


@dataclass(frozen=True)
class Runtime:
    """The worker's side of the comparison."""

    device: torch.device
    torch_version: str
    cpu_flags: frozenset[str] | None
    """The CPU's feature flags (``/proc/cpuinfo``); None where they cannot be read."""
    compute_capability: str


def current_runtime(device: torch.device) -> Runtime:
    capability = ""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        capability = f"{major}{minor}"
    return Runtime(device, torch.__version__, cpu_flags(), capability)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's feature flags: read, not probed (torch's own probe compiles a program per
    instruction set, seconds of a worker's start)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def missing_cpu_flags(isa: str, flags: frozenset[str]) -> list[str]:
    """The flags that the kernels of ``isa`` (``AOTI_CPU_ISA``: ``AVX512 AVX512_VNNI``)
    need and the CPU lacks."""
    needed = [flag for part in isa.split() for flag in ISA_FLAGS.get(part, ())]
    return [flag for flag in dict.fromkeys(needed) if flag not in flags]


def mismatch(path: Path, target: PackageTarget, runtime: Runtime) -> str | None:
    """Why the package cannot run on ``runtime``; None if it can."""
    device = runtime.device
    if target.device_type != device.type:
        return (
            f"{path.name} was compiled for {target.device_type} and this worker runs on "
            f"{device}: compile it on a {device.type} machine (ferry archive --aot-inductor)"
        )
    if target.torch_version and target.torch_version != runtime.torch_version:
        return (
            f"{path.name} was compiled with torch {target.torch_version} and this worker "
            f"has torch {runtime.torch_version}: compile it again with this torch"
        )
    if device.type == "cpu" and target.cpu_isa and runtime.cpu_flags is not None:
        missing = missing_cpu_flags(target.cpu_isa, runtime.cpu_flags)
        if missing:
            return (
                f"{path.name} holds CPU kernels for {target.cpu_isa} and this machine's CPU "
                f"lacks {', '.join(missing)}: compile it on a machine like this one"
            )
    if (
        device.type == "cuda"
        and target.compute_capability
        and target.compute_capability != runtime.compute_capability
    ):
        return (
            f"{path.name} was compiled for GPUs of compute capability "
            f"{target.compute_capability} and this one has {runtime.compute_capability}"
        )
    return None


class AotiModel:
    """A loaded package, called like the module it was compiled from; batches over its
    compiled maximum run in slices."""

    def __init__(self, compiled: Callable[..., Any], target: PackageTarget) -> None:
        self.compiled = compiled
        self.target = target

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        limit = self.target.max_batch
        if (
            limit is None
            or args
            or kwargs
            or not isinstance(batch, torch.Tensor)
            or batch.shape[0] <= limit
        ):
            return self.compiled(batch, *args, **kwargs)
        parts = [batch[start : start + limit] for start in range(0, batch.shape[0], limit)]
        return _joined([self.compiled(part) for part in parts])

    def eval(self) -> AotiModel:
        return self  # compiled for inference: nothing to switch


def _joined(outputs: list[Any]) -> Any:
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs)
    if isinstance(first, (list, tuple)):
        return type(first)(_joined([out[i] for out in outputs]) for i in range(len(first)))
    if isinstance(first, dict):
        return {key: _joined([out[key] for out in outputs]) for key in first}
    raise ArchiveError(f"cannot join the outputs of a sliced batch: {type(first).__name__}")


def load_aoti_package(path: Path, device: torch.device) -> AotiModel:
    """The package at ``path``, checked against this worker, loaded on ``device``."""
    target = package_target(path)
    reason = mismatch(path, target, current_runtime(device))
    if reason is not None:
        raise ArchiveError(reason)
    # The CPU's flags, checked above against the package's, answer Inductor's test builds.
    try:
        with vector_isa_from_cpu_flags():
            compiled = load_package_file(path, device)
    except RuntimeError as error:
        raise ArchiveError(f"{path.name}: AOTInductor could not load it: {error}") from error
    return AotiModel(compiled, target)


def load_package_file(path: Path, device: torch.device) -> Any:
    """torch's ``aoti_load_package`` of ``path`` on ``device``, on whichever torch has
    one (see the module's docstring)."""
    try:
        from torch._inductor import aoti_load_package
    except ImportError as error:
        raise ArchiveError(
            f"{path.name}: loading an AOTInductor package needs torch 2.6 or later "
            f"(torch._inductor.aoti_load_package); this worker has torch {torch.__version__}"
        ) from error
    index = device.index if device.type == "cuda" and device.index is not None else -1
    if "device_index" in inspect.signature(aoti_load_package).parameters:
        return aoti_load_package(str(path), device_index=index)
    if index >= 0:
        torch.cuda.set_device(index)  # the loader takes the current device
    return aoti_load_package(str(path))
