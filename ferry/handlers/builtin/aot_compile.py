"""Compiling a model into an AOTInductor package (``ferry archive --aot-inductor``).

The model is loaded as a worker would load it (an eager ``nn.Module`` from its model file
and state dict, a ``torch.export`` program, or TorchScript through torch's converter),
exported with its batch dimension dynamic from 1 to ``max_batch``, compiled with
AOTInductor for the device the archive is made on, and checked against the model it came
from on random inputs of one row and of ``max_batch`` rows: a package whose answers
differ by more than ``tolerance`` is refused, not archived.

Compiling belongs here, at archive time, not at a worker's first load: it takes tens of
seconds (22 s for a ResNet-50 on a 2-core CPU; more for larger models), needs a C++
compiler (and, for a GPU package, the GPU), and its result is a file every worker and
every replica then loads in seconds. The package is tied to the device type, CPU
instruction set or GPU generation, and torch version it was compiled with;
``ferry.handlers.builtin.aot_package`` refuses it elsewhere with the reason.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ferry.errors import ArchiveError
from ferry.handlers.builtin.aot_check import answers_in_fresh_process, tensors
from ferry.handlers.builtin.aot_package import MAX_BATCH_KEY, TORCH_KEY
from ferry.handlers.builtin.model_loading import load_eager_model

CPU = torch.device("cpu")


@dataclass(frozen=True)
class CompiledPackage:
    path: Path
    seconds: float
    """Export and compilation, wall time."""
    max_difference: float
    """The largest absolute difference from the source model's output over the checks."""


def source_model(
    serialized_file: Path | None, model_file: Path | None, example: torch.Tensor
) -> torch.nn.Module:
    """The model to compile, in eval mode on the CPU. A model file is imported with its
    own folder first on the import path, as a worker imports it from the model folder
    (so it may import the extra files that sit beside it)."""
    if model_file is not None:
        folder = str(model_file.resolve().parent)
        sys.path.insert(0, folder)
        try:
            return load_eager_model(model_file, serialized_file, CPU).eval()
        finally:
            sys.path.remove(folder)
    if serialized_file is None:
        raise ArchiveError("--aot-inductor needs the model: --model-file or --serialized-file")
    if serialized_file.suffix == ".pt2":
        program = torch.export.load(str(serialized_file))
        return program.module()
    return _from_torchscript(serialized_file, example)


def _from_torchscript(path: Path, example: torch.Tensor) -> torch.nn.Module:
    scripted = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    try:
        from torch._export.converter import TS2EPConverter

        program = TS2EPConverter(scripted.eval(), (example,)).convert()
    except Exception as error:  # the converter raises many kinds for what it cannot read
        raise ArchiveError(
            f"{path.name}: torch could not convert this TorchScript model for AOTInductor "
            f"({type(error).__name__}: {_first_line(error)}); archive the eager model "
            "instead (--model-file with its state dict)"
        ) from error
    return program.module()


def compile_package(
    model: torch.nn.Module,
    input_shape: tuple[int, ...],
    max_batch: int,
    target: Path,
    *,
    device: torch.device = CPU,
    tolerance: float = 1e-4,
) -> CompiledPackage:
    """``model`` compiled for ``device`` into the package ``target``, checked against it."""
    try:
        from torch._inductor import aoti_compile_and_package
    except ImportError as error:
        raise ArchiveError(
            "--aot-inductor needs torch 2.6 or later (torch._inductor.aoti_compile_and_package);"
            f" this is torch {torch.__version__}"
        ) from error

    if max_batch < 1:
        raise ArchiveError("--max-batch must be at least 1")
    model = model.to(device).eval()
    # Two rows: torch.export treats a dimension of size 1 as fixed.
    example = torch.randn(2, *input_shape, device=device)
    started = time.monotonic()
    batch = torch.export.Dim("batch", min=1, max=max(max_batch, 2))
    with torch.no_grad():
        try:
            program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
        except Exception as error:  # torch.export's many kinds of refusal
            raise ArchiveError(
                f"torch.export could not export the model with a dynamic batch dimension "
                f"({type(error).__name__}: {_first_line(error)})"
            ) from error
        metadata = {TORCH_KEY: torch.__version__, MAX_BATCH_KEY: str(max_batch)}
        path = aoti_compile_and_package(
            program,
            package_path=str(target),
            inductor_configs={"aot_inductor.metadata": metadata},
        )
    seconds = time.monotonic() - started
    difference = _max_difference(model, Path(path), input_shape, max_batch, device)
    if difference > tolerance:
        Path(path).unlink(missing_ok=True)
        raise ArchiveError(
            f"the compiled model's answers differ from the model's by up to {difference:.2e} "
            f"(more than {tolerance:g}); not archived"
        )
    return CompiledPackage(Path(path), seconds, difference)


def _max_difference(
    model: torch.nn.Module,
    package: Path,
    input_shape: tuple[int, ...],
    max_batch: int,
    device: torch.device,
) -> float:
    generator = torch.Generator().manual_seed(0)
    sizes = sorted({1, max_batch})
    batches = [torch.randn(rows, *input_shape, generator=generator) for rows in sizes]
    answers = answers_in_fresh_process(package, device, batches)
    worst = 0.0
    with torch.no_grad():
        for batch, got in zip(batches, answers, strict=True):
            expected = tensors(model(batch.to(device)))
            if len(expected) != len(got):
                raise ArchiveError(
                    f"the compiled model gives {len(got)} tensors, the model {len(expected)}"
                )
            for want, have in zip(expected, got, strict=True):
                worst = max(worst, (want.float().cpu() - have.float()).abs().max().item())
    return worst


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
