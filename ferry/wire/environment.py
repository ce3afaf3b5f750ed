"""The environment a worker process starts with: what the frontend sets and the worker
reads (memory settings, and the cores ``cpu_pinning`` bound it to)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

GLIBC_MALLOC_SETTINGS = {
    # glibc serves large blocks with mmap and hands freed heap tops back to the OS, so every
    # batch's activation buffers were page-faulted in afresh: ResNet-18 batches on CPU ran
    # ~13% faster once freed memory stays in the heap for the next batch. The cost: a
    # worker keeps up to 1 GiB of freed heap instead of returning it to the OS.
    "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": str(2**30),
}


def worker_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker process starts with; the user's own values win."""
    return {**GLIBC_MALLOC_SETTINGS, **base, "PYTHONUNBUFFERED": "1"}


BOUND_GPU = "FERRY_WORKER_GPU"
"""Set in a worker bound to one GPU: the machine's index of that GPU (describe's)."""


def gpu_environment(gpu: int, parent: Mapping[str, str]) -> dict[str, str]:
    """What binds a worker to GPU ``gpu`` (the server's index): that GPU is the only one
    it sees, as ``cuda:0``, in every thread it or its handler starts. Under a
    ``CUDA_VISIBLE_DEVICES`` of the server's own, ``gpu`` indexes that list.

    Indexes are in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless the server's
    environment says otherwise), the order NVML counts in, so that describe, GPU metrics
    and the worker name the same GPU on a machine of mixed GPUs (CUDA's own default puts
    the fastest first).

    >>> gpu_environment(1, {})
    {'CUDA_VISIBLE_DEVICES': '1', 'CUDA_DEVICE_ORDER': 'PCI_BUS_ID', 'FERRY_WORKER_GPU': '1'}
    >>> gpu_environment(1, {"CUDA_VISIBLE_DEVICES": "4,GPU-8f2c"})["CUDA_VISIBLE_DEVICES"]
    'GPU-8f2c'
    """
    visible = [d.strip() for d in parent.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    device = visible[gpu] if gpu < len(visible) else str(gpu)
    order = parent.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return {"CUDA_VISIBLE_DEVICES": device, "CUDA_DEVICE_ORDER": order, BOUND_GPU: str(gpu)}


def handler_gpu(gpu: int | None, environ: Mapping[str, str]) -> int | None:
    """The GPU index a handler is given (``gpu_id``): 0 in a worker bound to its GPU (the
    only one it sees), so TorchServe's ``cuda:{gpu_id}`` is that GPU.

    >>> handler_gpu(3, {BOUND_GPU: "3"}), handler_gpu(3, {}), handler_gpu(None, {})
    (0, 3, None)
    """
    if gpu is None or BOUND_GPU not in environ:
        return gpu
    return 0


USER_AFFINITY = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")
"""Variables by which a user pins threads themselves: with any set, Ferry pins nothing."""

PINNED_BY_FERRY = "FERRY_PINNED_CORES"
"""Set in a worker Ferry pinned, so that the worker can drop the binding variables once
torch has read them: processes it starts (a preprocess pool) must not inherit them."""


def user_pins_threads(environ: Mapping[str, str]) -> bool:
    return any(environ.get(name) for name in USER_AFFINITY)


def pinned_environment(cores: Sequence[int]) -> dict[str, str]:
    """What binds a worker's OpenMP threads (torch's intra-op threads) to ``cores``, one
    thread per core.

    >>> pinned_environment((2, 3))
    {'OMP_PLACES': '{2},{3}', 'OMP_PROC_BIND': 'close', 'FERRY_PINNED_CORES': '2,3'}
    """
    return {
        "OMP_PLACES": ",".join(f"{{{core}}}" for core in cores),
        "OMP_PROC_BIND": "close",
        PINNED_BY_FERRY: ",".join(map(str, cores)),
    }
