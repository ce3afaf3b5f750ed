"""``ferry bench load``'s targets and figures without sockets: URL parsing, goodput and
success-only percentiles over a fake target, and (in a subprocess, so Ferry's
``inference.*`` descriptors stay out of this process) V2 JSON requests made gRPC ones."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter

import pytest

from ferry_bench.load import LoadSpec, run_load
from ferry_bench.load_report import format_summary, load_summary
from ferry_bench.target_types import Answer, GrpcCall, NoAnswer, TargetSpec, UnsupportedTarget
from ferry_bench.targets import check_url, grpc_call, open_target


@pytest.mark.parametrize(
    ("url", "call"),
    [
        ("grpc://h:7070/predictions/m", GrpcCall("h:7070", "torchserve", "m", "")),
        ("grpc://h:7070/predictions/m/2.0", GrpcCall("h:7070", "torchserve", "m", "2.0")),
        ("grpc://h:1/v2/models/m/infer", GrpcCall("h:1", "v2", "m", "")),
        ("grpc://h:1/v2/models/m/versions/3/infer", GrpcCall("h:1", "v2", "m", "3")),
    ],
)
def test_grpc_urls_name_their_call(url: str, call: GrpcCall) -> None:
    assert grpc_call(url) == call


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("grpc://h/predictions/m", "needs a host and port"),
        ("grpc://h:x/predictions/m", "Port could not be cast"),
        ("grpc://h:1/v2/models/m", "/v2/models/MODEL[/versions/V]/infer"),
        ("grpc://h:1/models/m", "/predictions/MODEL[/VERSION]"),
        ("ftp://h/predictions/m", "must start with http://, https:// or grpc://"),
    ],
)
def test_urls_no_target_speaks_are_refused_with_the_reason(url: str, words: str) -> None:
    with pytest.raises(UnsupportedTarget, match=words.replace("[", r"\[").replace("]", r"\]")):
        check_url(url)


def test_no_payloads_is_refused() -> None:
    with pytest.raises(UnsupportedTarget, match="no payloads"):
        open_target(TargetSpec("http://h:1/predictions/m", []))


class ScriptedTarget:
    """Answers request ``i`` with ``script[i % len]``: a status, or an exception kind."""

    protocol = "fake"

    def __init__(self, script: list[int | str], code: bool = False) -> None:
        self.script = script
        self.code = code
        self.closed = False

    async def send(self, index: int) -> Answer:
        step = self.script[index % len(self.script)]
        if isinstance(step, str):
            raise NoAnswer(step)
        return Answer(step, b"", "OK" if self.code and step == 200 else None)

    async def close(self) -> None:
        self.closed = True


def _run(spec: LoadSpec, target: ScriptedTarget) -> dict[str, object]:
    result = asyncio.run(run_load(spec, target=target))
    assert target.closed
    return load_summary(spec, result)


def test_errors_are_no_throughput_and_no_latency() -> None:
    spec = LoadSpec("http://h:1/predictions/m", [b"x"], concurrency=4, requests=100)
    target = ScriptedTarget([200, 503, 503, 404, "ClientConnectorError"])
    summary = _run(spec, target)
    assert summary["requests_sent"] == 100 and summary["succeeded"] == 20
    assert summary["responses"] == 80  # answered; 20 got no answer at all
    assert summary["errors"] == {"404": 20, "503": 40, "ClientConnectorError": 20}
    assert summary["error_rate"] == 0.8


def test_a_run_where_nothing_succeeds_prints_no_latency() -> None:
    spec = LoadSpec("http://h:1/predictions/m", [b"x"], concurrency=2, requests=10)
    summary = _run(spec, ScriptedTarget([404]))
    assert summary["goodput"] == 0 and summary["p99_ms"] is None
    text = format_summary(summary)
    assert "no request succeeded" in text and "404: 10" in text and "100.00%" in text


def test_open_loop_counts_every_arrival() -> None:
    spec = LoadSpec("http://h:1/predictions/m", [b"x"], rate=5000, requests=200, seed=3)
    summary = _run(spec, ScriptedTarget([200, 200, 200, 500]))
    assert summary["requests_sent"] == 200 and summary["succeeded"] == 150
    assert summary["errors"] == {"500": 50} and summary["mode"] == "open"


def test_summary_percentiles_describe_successes_only() -> None:
    from ferry_bench.load import LoadResult

    result = LoadResult(
        requests=100,
        seconds=2.0,
        latencies_ms=[float(i) for i in range(1, 98)],
        error_latencies_ms=[5000.0] * 3,
        statuses=Counter({200: 97, 503: 3}),
    )
    spec = LoadSpec("grpc://h:1/predictions/m", [b""], concurrency=4, requests=100)
    summary = load_summary(spec, result)
    assert summary["goodput"] == 48.5 and summary["max_ms"] == 97.0
    assert summary["p99_ms"] == pytest.approx(96.04)
    assert summary["errors"] == {"503": 3} and summary["error_rate"] == 0.03


_CONVERT = """
import json, sys
from ferry_bench.grpc_targets import infer_request
from ferry.grpc import open_inference

document = json.loads(sys.argv[1])
request = infer_request("m", "2", json.dumps(document).encode())
decoded = open_inference.infer_request(request)
image = infer_request("m", "", b"\\x89PNG")
print(json.dumps({
    "model": [request.model_name, request.model_version],
    "raw_inputs": len(request.raw_input_contents),
    "outputs": [o.name for o in request.outputs],
    "handler_document": decoded.handler_document(),
    "image": [[t.name, t.datatype, list(t.shape)] for t in image.inputs],
    "image_bytes": [c.decode("latin-1") for c in image.inputs[0].contents.bytes_contents],
}))
"""


def test_a_v2_json_request_becomes_the_same_tensors_over_grpc() -> None:
    pytest.importorskip("grpc")
    document = {
        "id": "r1",
        "parameters": {"priority": 2},
        "inputs": [
            {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1.5, 2], [3, 4]]},
            {"name": "h", "shape": [2], "datatype": "FP16", "data": [0.5, -1]},
            {"name": "n", "shape": [1], "datatype": "INT64", "data": [-7]},
            {"name": "t", "shape": [1], "datatype": "BYTES", "data": ["hi"]},
        ],
        "outputs": [{"name": "y"}],
    }
    result = subprocess.run(
        [sys.executable, "-c", _CONVERT, json.dumps(document)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    converted = json.loads(result.stdout)
    assert converted["model"] == ["m", "2"] and converted["raw_inputs"] == 4
    assert converted["outputs"] == ["y"]
    handed = converted["handler_document"]
    assert handed["id"] == "r1" and handed["parameters"] == {"priority": 2}
    assert [t["data"] for t in handed["inputs"][:3]] == [[1.5, 2.0, 3.0, 4.0], [0.5, -1.0], [-7]]
    assert handed["inputs"][0]["shape"] == [2, 2]
    assert handed["inputs"][3]["data"] == ["aGk="]  # gRPC BYTES reach handlers as base64
    assert converted["image"] == [["input-0", "BYTES", [1]]]
    assert converted["image_bytes"] == ["\x89PNG"]


_IMPORTS = """
import sys
import ferry_bench.load, ferry_bench.targets
print(",".join(sorted(m for m in sys.modules if m == "grpc" or m.startswith("ferry_bench."))))
"""


def test_opening_no_grpc_target_imports_neither_grpcio_nor_the_grpc_targets() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORTS], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.strip().split(","))
    assert "ferry_bench.target_types" in loaded and "ferry_bench.http_target" in loaded
    assert not loaded & {"grpc", "ferry_bench.grpc_targets"}


def test_the_target_types_import_no_target() -> None:
    import ast
    from pathlib import Path

    import ferry_bench.target_types as types

    tree = ast.parse(Path(types.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("ferry")}
