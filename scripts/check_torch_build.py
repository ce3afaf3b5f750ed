"""Checks that the torch an install resolved is the build asked for: its version, and the
CUDA version its wheel index names (``.../whl/cu128`` is CUDA 12.8, ``.../whl/cpu`` none).
A mismatched pair (a CUDA index without that torch version, say) makes pip fall back to
another build silently; the container build stops here instead, saying which.

With ``--torchvision VERSION``, torchvision too: that version, the release made for this
torch (torchvision 0.N+15 goes with torch 2.N), built for the same CUDA (or none), and
its compiled operators load (a CUDA torchvision beside a CPU torch fails on import).

    python scripts/check_torch_build.py TORCH_VERSION [TORCH_INDEX_URL] [--torchvision V]
"""

from __future__ import annotations

import re
import sys


def mismatch(installed: str, installed_cuda: str | None, wanted: str, index_url: str) -> str | None:
    """Why the installed torch is not the build asked for, or None.

    >>> mismatch("2.13.0+cu128", "12.8", "2.13.0", "https://download.pytorch.org/whl/cu128")
    >>> mismatch("2.13.0+cpu", None, "2.13.0", "https://download.pytorch.org/whl/cu124")
    'torch 2.13.0+cpu has no CUDA, but the index asks for CUDA 12.4 (whl/cu124)'
    """
    if installed.split("+")[0] != wanted:
        return f"torch {installed} was installed, not {wanted}"
    found = re.search(r"/whl/(cpu|cu(\d+))/?$", index_url)
    if found is None:
        return None  # PyPI or a mirror: any build of that version will do
    if found.group(1) == "cpu":
        if installed_cuda:
            return f"torch {installed} is built for CUDA {installed_cuda}, the index is the CPU one"
        return None
    digits = found.group(2)
    cuda = f"{digits[:-1]}.{digits[-1]}"
    if installed_cuda is None:
        return f"torch {installed} has no CUDA, but the index asks for CUDA {cuda} (whl/cu{digits})"
    if installed_cuda != cuda:
        return f"torch {installed} is built for CUDA {installed_cuda}, the index for {cuda}"
    return None


def torchvision_mismatch(
    torch_version: str,
    torch_cuda: str | None,
    vision_version: str,
    vision_cuda: str | None,
    wanted: str,
) -> str | None:
    """Why the installed torchvision does not go with the torch beside it, or None.

    >>> torchvision_mismatch("2.13.0+cpu", None, "0.28.0+cpu", None, "0.28.0")
    >>> torchvision_mismatch("2.13.0", "13.0", "0.27.1", "13.0", "0.27.1")
    'torchvision 0.27.1 is made for torch 2.12, not torch 2.13.0'
    >>> torchvision_mismatch("2.13.0+cpu", None, "0.28.0", "13.0", "0.28.0")
    'torchvision 0.28.0 is built for CUDA 13.0, torch 2.13.0+cpu for none'
    """
    base = vision_version.split("+")[0]
    if base != wanted:
        return f"torchvision {vision_version} was installed, not {wanted}"
    major, minor = (int(part) for part in base.split(".")[:2])
    made_for = f"2.{minor - 15}" if major == 0 else "an unknown torch"
    if not torch_version.startswith(made_for + "."):
        return (
            f"torchvision {vision_version} is made for torch {made_for}, not torch {torch_version}"
        )
    vision_dotted = _dotted_cuda(vision_cuda)
    if vision_dotted != _dotted_cuda(torch_cuda):
        return (
            f"torchvision {vision_version} is built for CUDA {vision_dotted or 'none'}, "
            f"torch {torch_version} for {torch_cuda or 'none'}"
        )
    return None


def _dotted_cuda(version: object) -> str | None:
    """``13.0`` as torch says it, from torchvision's ``13000`` (an int: major * 1000 +
    minor * 10).

    >>> _dotted_cuda(13000), _dotted_cuda("13000"), _dotted_cuda("12.8"), _dotted_cuda(None)
    ('13.0', '13.0', '12.8', None)
    """
    if version is None or version == "":
        return None
    text = str(version)
    if text.isdigit():
        number = int(text)
        return f"{number // 1000}.{number % 1000 // 10}"
    return text


def _check_torchvision(wanted: str) -> str | None:
    import torch

    try:
        import torchvision
        from torchvision.ops import nms

        nms(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([1.0]), 0.5)  # compiled ops load
    except Exception as error:  # a build that does not load beside this torch
        return f"torchvision does not load beside torch {torch.__version__}: {error}"
    return torchvision_mismatch(
        torch.__version__,
        torch.version.cuda,
        torchvision.__version__,
        torchvision.version.cuda,
        wanted,
    )


def main(argv: list[str]) -> int:
    import torch

    vision = None
    if "--torchvision" in argv:
        at = argv.index("--torchvision")
        vision = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    wanted = argv[1]
    index_url = argv[2] if len(argv) > 2 else ""
    problem = mismatch(torch.__version__, torch.version.cuda, wanted, index_url)
    if problem is None and vision is not None:
        problem = _check_torchvision(vision)
    if problem is not None:
        print(
            f"check_torch_build: {problem}; choose an index that has torch {wanted}"
            + (f" and torchvision {vision} built for it" if vision else ""),
            file=sys.stderr,
        )
        return 1
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}) as asked")
    if vision is not None:
        import torchvision

        print(f"torchvision {torchvision.__version__}, made for it, loads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
