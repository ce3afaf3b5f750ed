"""The container build's check that pip installed the torch build asked for."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_torch_build.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("check_torch_build", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CU128 = "https://download.pytorch.org/whl/cu128"
CPU = "https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize(
    ("installed", "cuda", "index", "problem"),
    [
        ("2.13.0+cu128", "12.8", CU128, None),
        ("2.13.0+cpu", None, CPU, None),
        ("2.13.0", "12.8", "", None),  # PyPI: any build of the version
        ("2.12.1+cu128", "12.8", CU128, "torch 2.12.1+cu128 was installed, not 2.13.0"),
        ("2.13.0+cu126", "12.6", CU128, "built for CUDA 12.6, the index for 12.8"),
        ("2.13.0+cpu", None, CU128, "has no CUDA, but the index asks for CUDA 12.8"),
        ("2.13.0+cu128", "12.8", CPU, "built for CUDA 12.8, the index is the CPU one"),
    ],
)
def test_the_installed_build_is_checked_against_the_index(
    installed: str, cuda: str | None, index: str, problem: str | None
) -> None:
    found = _module().mismatch(installed, cuda, "2.13.0", index)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_this_environments_torch_passes() -> None:
    import torch

    assert _module().mismatch(torch.__version__, torch.version.cuda, "2.13.0", "") is None


@pytest.mark.parametrize(
    ("torch", "torch_cuda", "vision", "vision_cuda", "problem"),
    [
        ("2.13.0+cpu", None, "0.28.0+cpu", None, None),
        ("2.13.0", "13.0", "0.28.0", "13.0", None),  # PyPI's default pair
        ("2.13.0+cu130", "13.0", "0.28.0+cu130", "13000", None),  # torchvision's own spelling
        ("2.13.0+cpu", None, "0.28.0", "13.0", "built for CUDA 13.0, torch 2.13.0+cpu for none"),
        ("2.13.0", "13.0", "0.27.1", "13.0", "was installed, not 0.28.0"),
    ],
)
def test_torchvision_is_checked_against_the_torch_beside_it(
    torch: str, torch_cuda: str | None, vision: str, vision_cuda: str | None, problem: str | None
) -> None:
    found = _module().torchvision_mismatch(torch, torch_cuda, vision, vision_cuda, "0.28.0")
    assert found == problem or (problem is not None and problem in found)


def test_a_torchvision_made_for_another_torch_is_named() -> None:
    found = _module().torchvision_mismatch("2.13.0", "13.0", "0.27.1", "13.0", "0.27.1")
    assert found == "torchvision 0.27.1 is made for torch 2.12, not torch 2.13.0"
