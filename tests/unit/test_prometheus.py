from __future__ import annotations

import re
import sys

import pytest

from ferry.metrics.definitions import FerryMetrics
from ferry.metrics.prometheus import Family, render


def test_exposition_format_for_each_type() -> None:
    counter = Family("c_total", "A counter.", "counter", ("a",))
    counter.counter('x"y').inc(2)
    gauge = Family("g", "A gauge.", "gauge", ())
    gauge.gauge().set(1.5)
    histogram = Family("h_seconds", "A histogram.", "histogram", ("m",), buckets=(0.1, 1.0))
    for value in (0.05, 0.5, 5.0):
        histogram.histogram("k").observe(value)
    text = render([counter, gauge, histogram])
    assert '# TYPE c_total counter\nc_total{a="x\\"y"} 2\n' in text
    assert "g 1.5\n" in text
    assert 'h_seconds_bucket{m="k",le="0.1"} 1\n' in text
    assert 'h_seconds_bucket{m="k",le="1"} 2\n' in text
    assert 'h_seconds_bucket{m="k",le="+Inf"} 3\n' in text
    assert 'h_seconds_sum{m="k"} 5.55\nh_seconds_count{m="k"} 3\n' in text


def test_each_family_is_declared_once_and_scraped_in_that_order() -> None:
    """``ferry.metrics.families`` declares each family once; the scrape lists them all, in
    the order declared, each under one name."""
    metrics = FerryMetrics(hostname="host")
    declared = [family.name for family in metrics.own_families()]
    assert len(declared) == len(set(declared))
    assert metrics.requests_total in metrics.own_families()
    assert set(metrics.torchserve.values()) <= set(metrics.own_families())
    scraped = re.findall(r"^# TYPE (\S+) ", metrics.exposition(), re.M)
    assert scraped == declared


def test_model_metrics_and_forgetting_a_model() -> None:
    metrics = FerryMetrics(hostname="host")
    model = metrics.for_model("m", "1.0")
    model.request_done(0.002, 0.0005)
    model.dispatched([0.0005, 0.001], batch_size=2)
    model.stages({"inference": 1.5})
    model.handler_metric("Custom Thing", 3, "count", "counter", {"d": "v"})
    model.handler_metric("Custom Thing", 4, "count", "counter", {"d": "v"})
    text = metrics.exposition()
    assert (
        'ts_inference_requests_total{model_name="m",model_version="1.0",hostname="host"} 1' in text
    )
    assert (
        'ts_queue_latency_microseconds{model_name="m",model_version="1.0",hostname="host"} 500'
        in text
    )
    assert 'Custom_Thing{d="v",Hostname="host",} 7.0' in text
    metrics.forget_model("m", "1.0")
    text = metrics.exposition()
    assert 'model_name="m"' not in text
    assert "Custom_Thing{" not in text


def test_disabled_metrics_record_nothing() -> None:
    metrics = FerryMetrics(enabled=False, hostname="h")
    metrics.for_model("m", "1").request_done(1.0, 0.1)
    metrics.response_recorder("inference")(200)
    text = metrics.exposition()
    assert "} 1" not in text


class _FakeNvml:
    """Stands in for pynvml: two GPUs with fixed readings."""

    class _Memory:
        used, total = 3 * 2**30, 80 * 2**30

    class _Rates:
        gpu = 57

    shut_down = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        _FakeNvml.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> object:
        return self._Memory()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> object:
        return self._Rates()


def test_gpu_readings_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from ferry.metrics import gpu

    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    readings = gpu.read_gpus()
    assert [r.index for r in readings] == [0, 1] and _FakeNvml.shut_down
    metrics = FerryMetrics(hostname="h")
    metrics.record_gpus(readings)
    text = metrics.exposition()
    assert f'ferry_gpu_memory_used_bytes{{gpu="1"}} {3 * 2**30}' in text
    assert 'ferry_gpu_utilization_percent{gpu="0"} 57' in text
    assert 'GPUMemoryUsed{Level="Host",DeviceId="1",Hostname="h",} 3072.0' in text
    assert 'GPUMemoryUtilization{Level="Host",DeviceId="0",Hostname="h",} 3.75' in text
    assert 'GPUUtilization{Level="Host",DeviceId="1",Hostname="h",} 57.0' in text


def test_no_nvml_means_no_gpu_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    from ferry.metrics import gpu

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu.read_gpus() == []


SAMPLE = re.compile(  # the text format allows a comma after the last label
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
    r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*,?\})? \S+$'
)


def assert_parseable(text: str) -> None:
    """What Prometheus's text parser insists on: valid names, one HELP/TYPE per family."""
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")]
    assert len(helps) == len(set(helps)), "a family is described twice"
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert SAMPLE.match(line), line
            labels = line[line.find("{") + 1 : line.rfind("}")] if "{" in line else ""
            names = re.findall(r'([a-zA-Z_0-9]+)="', labels)
            assert not any(name.startswith("__") for name in names), line
            assert len(names) == len(set(names)), line


def test_handler_metrics_cannot_break_the_scrape() -> None:
    metrics = FerryMetrics(hostname="host")
    model = metrics.for_model("m", "1.0")
    model.request_done(0.002, 0.0005)
    model.handler_metric("ts_inference_requests_total", 1, "count", "counter", {})
    model.handler_metric("ferry_batch_size_bucket", 1, "count", "gauge", {})
    model.handler_metric("1bad_name", 2, "ms", "gauge", {"bad-label": "x", "__name": "y"})
    model.handler_metric("dims", 1, "ms", "gauge", {"model_name": "clash", "1d": "z"})
    model.handler_metric("dims", 5, "ms", "gauge", {"other": "dimension set"})  # refused
    text = metrics.exposition()
    assert_parseable(text)
    assert 'handler_ts_inference_requests_total{Hostname="host",}' in text
    assert "handler_ferry_batch_size_bucket{" in text
    assert '_1bad_name{x__name="y",bad_label="x",Hostname="host",}' in text
    assert '_1d="z",model_name="clash",Hostname="host"' in text
    assert "dimension set" not in text
    model.handler_metric("hosted", 1, "ms", "gauge", {"Hostname": "theirs"})
    model.handler_metric("ranged", 1, "ms", "histogram", {"le": "theirs"})
    text = metrics.exposition()
    assert_parseable(text)
    assert 'hosted{dim_Hostname="theirs",Hostname="host",} 1.0' in text
    assert 'ranged_count{dim_le="theirs",Hostname="host",} 1.0' in text


def _type(text: str, name: str) -> str:
    return next(line.split()[3] for line in text.splitlines() if line.startswith(f"# TYPE {name} "))


def test_torchserve_request_counters_count_inference_responses() -> None:
    metrics = FerryMetrics(hostname="host")
    inference = metrics.response_recorder("inference")
    for status in (200, 201, 404, 503):
        inference(status)
    metrics.response_recorder("management")(200)
    text = metrics.exposition()
    assert_parseable(text)
    assert 'Requests2XX{Level="Host",Hostname="host",} 2.0\n' in text
    assert 'Requests4XX{Level="Host",Hostname="host",} 1.0\n' in text
    assert 'Requests5XX{Level="Host",Hostname="host",} 1.0\n' in text
    assert all(_type(text, f"Requests{n}XX") == "counter" for n in (2, 4, 5))


def test_torchserve_model_metrics() -> None:
    metrics = FerryMetrics(hostname="host")
    model = metrics.for_model("m", "1.0")
    model.dispatched([0.002, 0.0035], batch_size=2)
    model.stages({"preprocess": 1.0, "inference": 4.5, "postprocess": 0.5})
    model.batch_done(7.25, 0.75)
    model.worker_loaded("m/1.0/w0", 1500.0)
    text = metrics.exposition()
    assert_parseable(text)
    assert 'QueueTime{Level="Host",Hostname="host",} 3.5\n' in text
    assert 'HandlerTime{ModelName="m",Level="Model",Hostname="host",} 6.0\n' in text
    assert 'PredictionTime{ModelName="m",Level="Model",Hostname="host",} 7.25\n' in text
    assert 'WorkerLoadTime{WorkerName="m/1.0/w0",Level="Host",Hostname="host",} 1500.0\n' in text
    assert 'WorkerThreadTime{Level="Host",Hostname="host",} 0.75\n' in text
    for name in (
        "QueueTime",
        "HandlerTime",
        "PredictionTime",
        "WorkerLoadTime",
        "WorkerThreadTime",
    ):
        assert _type(text, name) == "gauge"
    metrics.forget_model("m", "1.0")
    assert 'ModelName="m"' not in metrics.exposition()
    model.batch_done(2.0)  # another version of "m" still serving
    assert 'PredictionTime{ModelName="m",Level="Model",Hostname="host",} 2.0\n' in (
        metrics.exposition()
    )


def test_a_handlers_handler_time_is_torchserves_not_a_second_family() -> None:
    metrics = FerryMetrics(hostname="host")
    model = metrics.for_model("m", "1.0")
    model.stages({"handle": 9.0})
    model.handler_metric("HandlerTime", 8.5, "ms", "time", {"ModelName": "m", "Level": "Model"})
    model.handler_metric("HandlerTime", 2.0, "ms", "time", {"Extra": "x"})  # not TorchServe's
    model.handler_metric("PredictionTime", 1.0, "ms", "time", {})
    text = metrics.exposition()
    assert_parseable(text)
    assert 'HandlerTime{ModelName="m",Level="Model",Hostname="host",} 8.5\n' in text
    assert 'handler_HandlerTime{Extra="x",Hostname="host",} 2.0' in text
    assert "handler_PredictionTime{" in text


def test_torchserve_host_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    from ferry.metrics import definitions

    readings = iter([(50, 100), (80, 200)])
    monkeypatch.setattr(definitions, "cpu_jiffies", lambda: next(readings))
    monkeypatch.setattr(definitions, "memory_bytes", lambda: (4 * 2**30, 2**30))
    metrics = FerryMetrics(hostname="host")
    metrics.record_host()
    first = metrics.exposition()
    metrics.record_host()
    text = metrics.exposition()
    assert_parseable(text)
    host = '{Level="Host",Hostname="host",}'
    assert f"CPUUtilization{host} 50.0\n" in first and f"CPUUtilization{host} 30.0\n" in text
    assert f"MemoryUsed{host} 3072.0\n" in text
    assert f"MemoryAvailable{host} 1024.0\n" in text
    assert f"MemoryUtilization{host} 75.0\n" in text
    for name in ("DiskUsage", "DiskAvailable", "DiskUtilization"):
        assert _type(text, name) == "gauge"
        value = float(text.split(f"{name}{host} ", 1)[1].split()[0])
        assert value > 0 and (name != "DiskUtilization" or value <= 100)


def test_host_readings_from_proc() -> None:
    from ferry.procinfo import cpu_jiffies, memory_bytes

    busy, total = cpu_jiffies()
    assert 0 < busy < total
    memory_total, available = memory_bytes()
    assert 0 < available < memory_total
