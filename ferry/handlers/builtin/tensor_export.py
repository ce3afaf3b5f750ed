"""How a weights keeper hands its one copy of a model's weights to other processes: the
narrow seam between the keeper's protocol and the memory it shares.

The keeper (``ferry.worker.weights_keeper``) packs a model's tensors into one flat byte
buffer (``pack``), so a worker imports one allocation, not one per tensor. Where the
buffer lives is the exporter's:

- ``CudaExporter``: GPU memory, shared by CUDA IPC (torch's ``_share_cuda_`` /
  ``_new_shared_cuda``, what ``torch.multiprocessing`` sends for a CUDA tensor). The
  memory is the keeper's: it is freed when the keeper exits, whatever the importers hold.
- ``SharedMemoryExporter``: CPU shared memory, handed over as a file descriptor (torch's
  ``_share_fd_cpu_`` / ``_new_shared_fd_cpu``). The stand-in that lets the keeper's
  protocol and lifetime run where no GPU is, and a working mode on the CPU.

Nothing here enforces that importers only read: ``ferry.handlers.builtin.kept_weights``
watches for writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch

ALIGN = 256
"""Each tensor's offset in the flat buffer: a multiple of any element size (and of
CUDA's preferred alignment), so every tensor is a view of the buffer in its own dtype."""


@dataclass(frozen=True)
class KeptTensor:
    """Where one tensor of the state dict lies in the flat buffer (contiguous)."""

    name: str
    dtype: str
    """torch's name of it, without ``torch.`` (``float32``)."""
    shape: tuple[int, ...]
    offset: int

    @property
    def torch_dtype(self) -> torch.dtype:
        found = getattr(torch, self.dtype, None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"not a torch dtype: {self.dtype!r}")
        return found

    def nbytes(self) -> int:
        elements = 1
        for size in self.shape:
            elements *= size
        return elements * self.torch_dtype.itemsize


def pack(state: dict[str, torch.Tensor]) -> tuple[list[KeptTensor], int]:
    """Each tensor's place in one buffer, and the buffer's size in bytes."""
    layout, offset = [], 0
    for name, tensor in state.items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        layout.append(KeptTensor(name, dtype, tuple(tensor.shape), offset))
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return layout, offset


def fill(flat: torch.Tensor, layout: list[KeptTensor], state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``flat`` (a uint8 buffer of ``pack``'s size) where ``layout`` says."""
    for entry, view in zip(layout, views(flat, layout), strict=True):
        view.copy_(state[entry.name])


def views(flat: torch.Tensor, layout: list[KeptTensor]) -> list[torch.Tensor]:
    """The tensors of ``layout`` as views of ``flat``, in order."""
    tensors = []
    for entry in layout:
        raw = flat[entry.offset : entry.offset + entry.nbytes()]
        tensors.append(raw.view(entry.torch_dtype).view(entry.shape))
    return tensors


class TensorExporter(Protocol):
    """Allocates a buffer other processes can import, and exports / imports it."""

    kind: str
    """``cuda`` or ``cpu``: the device type the buffer is on, said to the importer."""

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of ``nbytes`` that ``export`` can hand out."""
        ...

    def export(self, flat: torch.Tensor) -> tuple[list[Any], list[int]]:
        """The handle's plain fields (msgpack's types) and the file descriptors to pass
        along (their receiver owns its copies)."""
        ...

    def import_flat(self, handle: list[Any], fds: list[int]) -> torch.Tensor:
        """The exported buffer in this process (``fds`` are closed here)."""
        ...


class SharedMemoryExporter:
    """CPU shared memory passed as a file descriptor."""

    kind = "cpu"

    def allocate(self, nbytes: int) -> torch.Tensor:
        flat = torch.empty(nbytes, dtype=torch.uint8)
        flat.share_memory_()  # type: ignore[no-untyped-call]
        return flat

    def export(self, flat: torch.Tensor) -> tuple[list[Any], list[int]]:
        fd, size = flat.untyped_storage()._share_fd_cpu_()
        return [int(size)], [fd]

    def import_flat(self, handle: list[Any], fds: list[int]) -> torch.Tensor:
        if len(handle) != 1 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ValueError(f"a shared-memory handle is one size and one descriptor: {handle}")
        try:  # torch maps its own duplicate of the descriptor
            new_shared = torch.UntypedStorage._new_shared_fd_cpu  # type: ignore[attr-defined]
            storage = new_shared(fds[0], int(handle[0]))
        finally:
            os.close(fds[0])
        return torch.empty(0, dtype=torch.uint8).set_(storage)


CUDA_HANDLE_FIELDS = 8
"""What ``_share_cuda_`` returns: device, handle, size, offset, the reference counter's
handle and offset, the event's handle, whether the event must be waited for."""


class CudaExporter:
    """GPU memory shared by CUDA IPC; the exporting process must outlive every importer's use."""

    kind = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def allocate(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def export(self, flat: torch.Tensor) -> tuple[list[Any], list[int]]:
        torch.cuda.synchronize(flat.device)  # the copy in is complete before anyone reads
        return list(flat.untyped_storage()._share_cuda_()), []  # type: ignore[no-untyped-call]

    def import_flat(self, handle: list[Any], fds: list[int]) -> torch.Tensor:
        for fd in fds:
            os.close(fd)
        if len(handle) != CUDA_HANDLE_FIELDS:
            raise ValueError(
                f"a CUDA IPC handle has {CUDA_HANDLE_FIELDS} fields, got {len(handle)}"
            )
        torch.cuda.init()  # type: ignore[no-untyped-call]
        storage = torch.UntypedStorage._new_shared_cuda(*handle)
        return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def exporter_for(kind: str, device: torch.device | None = None) -> TensorExporter:
    """The exporter of a keeper's device type (an importer needs no device)."""
    if kind == "cuda":
        return CudaExporter(device if device is not None else torch.device("cuda"))
    if kind == "cpu":
        return SharedMemoryExporter()
    raise ValueError(f"no tensor exporter for {kind!r}")
