"""Per-model Python packages: TorchServe's ``install_py_dep_per_model``.

When the setting is on and an archive names a requirements file (``torch-model-archiver
-r``; the manifest's ``model.requirementsFile``), the server runs ``pip install -r`` for it
into a folder of its own before any worker starts, and the workers find the packages there,
ahead of the server's own (TorchServe puts them in the model folder on ``PYTHONPATH``).
pip's own configuration applies (``PIP_INDEX_URL``, ``pip.conf`` ...). Off by default, as in
TorchServe: installing runs code from the index, so a server must opt in. ``allowed_urls``
does not restrict pip; ``pip_index_url`` / ``pip_find_links`` do (``ferry.store.pip_sources``).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ferry.errors import PackageInstallFailed
from ferry.log_escape import Verbatim
from ferry.store.archive import ModelArchive
from ferry.store.pip_sources import UNRESTRICTED, PipSources, check_requirements

log = logging.getLogger("ferry.store")

PIP_TIMEOUT = 900.0
"""Seconds one model's install may take before it is abandoned."""
PIP_OUTPUT_LINES = 5
"""Lines of pip's output quoted in the error (the rest is logged)."""


def with_packages(archive: ModelArchive, work_dir: Path, sources: PipSources) -> ModelArchive:
    """The archive with the packages of its requirements file installed (under
    ``work_dir``), or as it is when it has none."""
    requirements = requirements_path(archive.model_dir, archive.manifest.requirements_file)
    if requirements is None:
        return archive
    packages = install_packages(
        archive.name, archive.model_dir, requirements, work_dir, sources=sources
    )
    return dataclasses.replace(archive, packages=packages)


def requirements_path(model_dir: Path, requirements_file: str | None) -> Path | None:
    """The archive's requirements file, if its manifest names one that exists."""
    if not requirements_file:
        return None
    path = model_dir / requirements_file
    if not path.is_file():
        raise PackageInstallFailed(f"the manifest names {requirements_file!r}, which is missing")
    return path


def pip_command(
    requirements: Path,
    target: Path,
    python: str = sys.executable,
    sources: PipSources = UNRESTRICTED,
) -> list[str]:
    return [
        python,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--upgrade",
        "--target",
        str(target),
        *sources.options(),
        "-r",
        str(requirements),
    ]


def install_packages(
    model: str,
    model_dir: Path,
    requirements: Path,
    work_dir: Path,
    timeout: float = PIP_TIMEOUT,
    sources: PipSources = UNRESTRICTED,
) -> Path:
    """Install ``requirements`` into a new folder under ``work_dir`` and return it; raises
    ``PackageInstallFailed`` with pip's last lines (the folder is removed again), or, when
    ``sources`` restrict pip, before pip runs for a file that would reach beyond them."""
    if sources.restricted:
        check_requirements(model, model_dir, requirements)
    target = Path(tempfile.mkdtemp(prefix=f"{model}-packages-", dir=work_dir))
    command = pip_command(requirements, target, sources=sources)
    log.info("model %s: installing its packages from %s into %s", model, requirements.name, target)
    started = time.monotonic()
    try:
        # cwd: relative paths in the requirements file are relative to the model, as in
        # TorchServe, which runs pip in the model folder.
        done = subprocess.run(
            command,
            cwd=model_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(target, ignore_errors=True)
        raise PackageInstallFailed(
            f"Custom pip package installation failed for model {model}: pip did not finish "
            f"within {timeout:g}s"
        ) from exc
    except OSError as exc:
        shutil.rmtree(target, ignore_errors=True)
        raise PackageInstallFailed(f"cannot run pip for model {model}: {exc}") from exc
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        # pip's output, lines and all: about the archive's requirements, whose code the
        # workers run anyway; no client's value.
        log.error("model %s: pip failed (exit %d):\n%s", model, done.returncode, Verbatim(output))
        raise PackageInstallFailed(
            f"Custom pip package installation failed for model {model}: " + _reason(output)
        )
    log.info(
        "model %s: packages installed in %.1f s: %s",
        model,
        time.monotonic() - started,
        _last_lines(output, 1),
    )
    return target


def _reason(output: str) -> str:
    """pip's ``ERROR:`` lines when it printed any (its warnings are noise here), else its
    last lines."""
    errors = [line.strip() for line in output.splitlines() if line.startswith("ERROR:")]
    return " | ".join(errors[-PIP_OUTPUT_LINES:]) or _last_lines(output, PIP_OUTPUT_LINES)


def _last_lines(text: str, count: int) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-count:]) or "pip printed nothing"
