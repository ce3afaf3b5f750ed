"""The one handler loader: worker, ``ferry bench profile`` and benchmarks load alike, so a
TorchServe-style handler (``from ts.torch_handler ...``) loads in each, with its pipeline."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.store.archive import open_model
from ferry.worker.loading import SHIM_ROOT, load_handler, prepare_imports
from ferry.worker.pipeline import StagePipeline
from ferry_bench import profile as profiling
from tests.fixtures.models import archive_handler_spec, digest_archive, ts_style_archive


@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No ``ts`` shim on the path or among the imported modules, before and after."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(SHIM_ROOT)])
    before = set(sys.modules)
    for name in [n for n in before if n == "ts" or n.startswith("ts.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in set(sys.modules) - before:
        if name == "ts" or name.startswith("ts.") or name.endswith("_handler"):
            del sys.modules[name]


def test_prepare_imports_puts_the_model_first_and_the_shim_last(
    tmp_path: Path, clean_imports: None
) -> None:
    prepare_imports(str(tmp_path))
    prepare_imports(str(tmp_path))  # idempotent
    assert sys.path[0] == str(tmp_path) and sys.path[-1] == str(SHIM_ROOT)
    assert sys.path.count(str(tmp_path)) == 1 and sys.path.count(str(SHIM_ROOT)) == 1


def test_a_ts_style_handler_loads_with_its_pipeline(tmp_path: Path, clean_imports: None) -> None:
    store = tmp_path / "store"
    pipeline = {"micro_batch_size": 2, "parallelism": {"preprocess": 2}}
    ts_style_archive(store, name="piped", micro_batching=pipeline, handler={"scale": 3})
    archive = open_model(store, "piped.mar", tmp_path)
    ready = load_handler(archive_handler_spec(archive, "piped", 4), gpu_id=None)
    try:
        assert type(ready.instance).__name__ == "DoublingHandler"
        assert isinstance(ready.pipeline, StagePipeline)
        rows = [{"body": json.dumps([i, 1]).encode()} for i in range(3)]
        ready.context.start_batch(["a", "b", "c"], [{}, {}, {}])
        assert ready.entry(rows, ready.context) == [[0.0, 6.0], [6.0, 6.0], [12.0, 6.0]]
    finally:
        ready.close()


def test_bench_profile_loads_a_ts_style_handler(tmp_path: Path, clean_imports: None) -> None:
    store = tmp_path / "store"
    ts_style_archive(store)
    loaded = profiling.load_handler(store / "doubler.mar", tmp_path, "cpu")
    points = profiling.profile_batch(loaded, [b"[1, 2, 3]"], 2, "fp32", 0.01)
    assert [p.variant for p in points] == ["handler", "model"]
    assert loaded.entry([{"body": b"[1, 2]"}], loaded.context) == [[2.0, 4.0]]


@pytest.mark.parametrize(("handler", "envelope"), [("ts", ""), ("ts", "kserve"), ("function", "")])
def test_per_request_envelopes_only_for_torchserves_handlers_without_service_envelope(
    tmp_path: Path, clean_imports: None, handler: str, envelope: str
) -> None:
    """A TorchServe-style handler reads each request through its protocol's envelope
    unless ``service_envelope`` wraps every request; a function handler never does."""
    store = tmp_path / "store"
    name = ts_style_archive(store) if handler == "ts" else digest_archive(store, "digest")
    archive = open_model(store, name, tmp_path)
    ready = load_handler(archive_handler_spec(archive, "m", 4, envelope), gpu_id=None)
    try:
        if handler == "function" or envelope:
            assert ready.request_envelopes is None
            return
        envelopes = ready.request_envelopes
        assert envelopes is not None and envelopes("") is ready.entry
        ready.context.start_batch(["a"], [{}])
        rows = [{"body": {"instances": [{"data": [1, 2]}]}}]
        assert envelopes("kserve")(rows, ready.context) == [{"predictions": [[2.0, 4.0]]}]
    finally:
        ready.close()
