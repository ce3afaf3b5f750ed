"""Checks that the torch an install resolved is the build asked for: its version, and the
CUDA version its wheel index names (``.../whl/cu128`` is CUDA 12.8, ``.../whl/cpu`` none).
A mismatched pair (a CUDA index without that torch version, say) makes pip fall back to
another build silently; the container build stops here instead, saying which.

    python scripts/check_torch_build.py TORCH_VERSION [TORCH_INDEX_URL]
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


def main(argv: list[str]) -> int:
    import torch

    wanted = argv[1]
    index_url = argv[2] if len(argv) > 2 else ""
    problem = mismatch(torch.__version__, torch.version.cuda, wanted, index_url)
    if problem is not None:
        print(
            f"check_torch_build: {problem}; choose an index that has torch {wanted}",
            file=sys.stderr,
        )
        return 1
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}) as asked")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
