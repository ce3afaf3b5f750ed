"""TorchServe compatibility: ``ts.metrics.process_memory_metric``."""

from ferry.handlers.torchserve.process_memory import check_process_mem_usage, get_cpu_usage

__all__ = ["check_process_mem_usage", "get_cpu_usage"]
