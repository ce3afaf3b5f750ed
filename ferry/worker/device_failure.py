"""Errors after which a worker's GPU context is unusable.

CUDA reports some kernel faults (a device-side assert, an illegal address, a launch
failure) as *sticky*: every later call in the process fails the same way. To the handler
they are exceptions like any other, so without this check the worker would retry its
requests one by one and go on serving from a poisoned context. Instead the worker exits
with ``DEVICE_FAILED_EXIT`` without answering, as if it had crashed: the frontend replaces
it, answers a lone request with the error, and retries batch-mates one at a time on fresh
workers, so only the request that faulted the GPU fails.
"""

from __future__ import annotations

STICKY_MARKERS = (
    "device-side assert",
    "illegal memory access",
    "an illegal instruction",
    "unspecified launch failure",
    "misaligned address",
    "uncorrectable ECC error",
    "hardware stack error",
    "invalid program counter",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "CUDNN_STATUS_EXECUTION_FAILED",
)
"""Words of CUDA's sticky errors (as torch and cuBLAS/cuDNN word them)."""
CUDA_WORDS = ("CUDA", "cuda", "CUBLAS", "CUDNN")
"""One of these must be in the message too: a CPU worker's "illegal memory access" (a
native extension's own words) is not the GPU's."""


def unrecoverable_device_error(exc: BaseException) -> str | None:
    """The first line of a sticky device error in ``exc`` or its causes, or None (an
    out-of-memory error, say, is not one: the next batch may fit).

    >>> unrecoverable_device_error(RuntimeError("CUDA error: device-side assert triggered\\nmore"))
    'CUDA error: device-side assert triggered'
    >>> unrecoverable_device_error(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = str(current)
        sticky = any(marker in message for marker in STICKY_MARKERS)
        if sticky and any(word in message for word in CUDA_WORDS):
            return message.strip().splitlines()[0] if message.strip() else type(current).__name__
        current = current.__cause__ or current.__context__
    return None
