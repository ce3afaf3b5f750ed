"""The environment that binds a GPU worker to its GPU."""

from __future__ import annotations

from ferry.wire.environment import BOUND_GPU, gpu_environment, handler_gpu


def test_a_gpu_worker_sees_its_gpu_in_pci_order() -> None:
    assert gpu_environment(2, {}) == {
        "CUDA_VISIBLE_DEVICES": "2",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # the order NVML and describe count in
        BOUND_GPU: "2",
    }
    # The server's own list and order are kept.
    server = {"CUDA_VISIBLE_DEVICES": "4, 6", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    chosen = gpu_environment(1, server)
    assert chosen["CUDA_VISIBLE_DEVICES"] == "6"
    assert chosen["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_a_bound_worker_gives_its_handler_gpu_zero() -> None:
    assert handler_gpu(3, {BOUND_GPU: "3"}) == 0
    assert handler_gpu(3, {}) == 3  # in-process (bench profile): the index as it is
    assert handler_gpu(None, {BOUND_GPU: "3"}) is None
