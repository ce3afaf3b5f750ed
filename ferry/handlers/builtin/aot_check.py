"""Running a freshly compiled AOTInductor package in a process of its own.

``ferry archive --aot-inductor`` checks the package it made against the model it came
from. The check loads the package in a new Python process, not the one that compiled it:
on an H200 with torch 2.11 (cu130), loading a CUDA package in the process that had just
compiled it crashed that process with signal 11 inside torch's loader, which killed
``ferry archive`` without a word. A child that crashes is reported as an
:class:`~ferry.errors.ArchiveError` naming the signal, and nothing is archived. A worker
loads the package in a fresh process too, so this is also the check closest to serving.

Run as ``python -m ferry.handlers.builtin.aot_check PACKAGE DEVICE INPUTS OUTPUTS``:
``INPUTS`` is a ``torch.save`` list of CPU tensors, each run as one batch; ``OUTPUTS``
receives, per batch, the list of CPU tensors the package answered.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ferry.errors import ArchiveError

CHECK_TIMEOUT_S = 600.0
"""Loading a package and running two batches; a GPU package's first load compiles nothing
(the kernels are in it), so minutes mean something is stuck."""


def answers_in_fresh_process(
    package: Path, device: torch.device, batches: list[torch.Tensor]
) -> list[list[torch.Tensor]]:
    """The package's answers to ``batches`` (CPU tensors), computed on ``device`` by a new
    process."""
    with tempfile.TemporaryDirectory(prefix="ferry-aot-check-") as tmp:
        inputs, outputs = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt"
        torch.save(batches, inputs)
        argv = [sys.executable, "-X", "faulthandler", "-m", __name__]
        argv += [str(package), str(device), str(inputs), str(outputs)]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as error:
            raise ArchiveError(
                f"{package.name}: loading and running the compiled package took over "
                f"{CHECK_TIMEOUT_S:.0f} s; not archived"
            ) from error
        if done.returncode < 0:  # its faulthandler stack, for the report the message asks for
            sys.stderr.write(done.stderr)
        if done.returncode != 0:
            raise ArchiveError(check_failure(package.name, done.returncode, done.stderr))
        answers: list[list[torch.Tensor]] = torch.load(outputs, weights_only=True)
        return answers


def check_failure(name: str, returncode: int, stderr: str) -> str:
    """What ``ferry archive`` says when the checking process failed."""
    if returncode < 0:
        try:
            what = signal.Signals(-returncode).name
        except ValueError:
            what = f"signal {-returncode}"
        return (
            f"{name}: torch crashed ({what}) loading or running the package it had just "
            "compiled, in a process of its own; not archived. Its stack is above: report "
            "it to PyTorch with your torch version, or archive the model without "
            "--aot-inductor"
        )
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit {returncode}"
    return f"{name}: the compiled package could not be loaded or run ({last}); not archived"


def tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in tensors(item)]
    if isinstance(output, dict):
        return [t for key in sorted(output) for t in tensors(output[key])]
    return []


def _main(argv: list[str]) -> None:
    from ferry.handlers.builtin.aot_package import load_package_file

    package, device_name, inputs, outputs = argv
    device = torch.device(device_name)
    compiled = load_package_file(Path(package), device)
    batches: list[torch.Tensor] = torch.load(inputs, weights_only=True)
    with torch.no_grad():
        answers = [
            [t.detach().cpu() for t in tensors(compiled(batch.to(device)))] for batch in batches
        ]
    torch.save(answers, outputs)


if __name__ == "__main__":
    try:
        _main(sys.argv[1:])
    except Exception as error:  # one line on stderr: the parent quotes the last one
        print(f"{type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
        raise SystemExit(1) from None
