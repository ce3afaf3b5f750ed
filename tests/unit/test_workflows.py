"""The workflow core: spec parsing, the DAG rules, .war archives and one request's run."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import zipfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from ferry.config.settings import ServerSettings
from ferry.errors import ArchiveError, HandlerFailed, InvalidRequest, WorkflowNotFound
from ferry.service import FerryService
from ferry.service.types import InputPart
from ferry.store.archive import open_model
from ferry.workflows import (
    InvalidWorkflow,
    WorkflowFailed,
    WorkflowNodeFailed,
    check_function_nodes,
    function_names,
    internal_name,
    open_war,
    parse_spec,
    run_workflow,
    write_war,
)
from ferry.workflows.manager import WorkflowManager, WorkflowRequest
from ferry.workflows.war import WAR_MANIFEST_PATH, WarManifest
from tests.fixtures.fake_worker import FakeFactory
from tests.fixtures.models import digest_archive

BOUND = 5.0
"""Seconds a test may take before it counts as hung."""

Calls = list[tuple[str, list[InputPart], dict[str, str]]]


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, BOUND))


# ----------------------------------------------------------------------------- spec


def test_a_global_applies_only_to_the_models_written_after_it() -> None:
    spec = parse_spec(
        """
models:
  batch-size: 2
  early: {url: early.mar}
  max-batch-delay: 200
  late: {url: late.mar}
dag:
  early: [late]
"""
    )
    early, late = spec.models["early"], spec.models["late"]
    assert (early.batch_size, early.max_batch_delay_ms) == (2, 50)
    assert (late.batch_size, late.max_batch_delay_ms) == (2, 200)
    assert (spec.globals.batch_size, spec.globals.max_batch_delay_ms) == (2, 200)


def test_defaults_and_per_model_overrides() -> None:
    spec = parse_spec(
        """
models:
  min-workers: 2
  max-workers: 3
  m1:
    url: m1.mar
    max-workers: 5
    timeout-ms: 300
    retry-attempts: 0
  m2: {url: "https://example.com/m2.mar"}
dag:
  m1: [m2]
"""
    )
    m1, m2 = spec.models["m1"], spec.models["m2"]
    assert (m1.min_workers, m1.max_workers, m1.timeout_ms, m1.retry_attempts) == (2, 5, 300, 0)
    assert (m2.min_workers, m2.max_workers, m2.batch_size, m2.max_batch_delay_ms) == (2, 3, 1, 50)
    assert (m2.retry_attempts, m2.timeout_ms) == (1, 10000)
    assert m2.url == "https://example.com/m2.mar"


def test_dag_nodes_that_are_not_models_are_functions() -> None:
    spec = parse_spec(
        """
models:
  retry-attempts: 3
  m1: {url: m1.mar}
  unused: {url: unused.mar}
dag:
  pre: [m1]
  m1: [post]
"""
    )
    assert list(spec.models) == ["m1"]  # a model the dag does not name is not registered
    assert spec.functions == ["pre", "post"]
    post = spec.node("post")
    assert post.is_function and not spec.node("m1").is_function
    assert (post.max_workers, post.batch_size, post.max_batch_delay_ms) == (1, 1, 0)
    assert post.retry_attempts == 3
    assert (spec.start, spec.leaves) == ("pre", ["post"])
    assert spec.topological_order() == ["pre", "m1", "post"]
    assert internal_name("wf", "m1") == "wf__m1"


def test_parents_and_order_of_a_diamond() -> None:
    spec = parse_spec("dag:\n  a: [b, c]\n  b: [d]\n  c: [d]\n")
    assert spec.parents("d") == ["b", "c"]
    assert spec.parents("a") == []
    order = spec.topological_order()
    assert order[0] == "a" and order[-1] == "d"
    assert spec.leaves == ["d"]


@pytest.mark.parametrize(
    ("dag", "message"),
    [
        ("a: [c]\n  b: [c]", "DAG should have only one start node"),
        ("a: [a]", "Self loop exception"),
        ("s: [a]\n  a: [b]\n  b: [a]", "Not a valid DAG"),
        ("a: [b]\n  b: [a]", "DAG should have only one start node"),
        ("a: [b, b]", "loop exception"),
    ],
)
def test_dag_rules(dag: str, message: str) -> None:
    with pytest.raises(InvalidWorkflow, match=re.escape(message)):
        parse_spec(f"dag:\n  {dag}\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models:\n  m1: {url: m1.mar}\n", "the 'dag' is empty"),
        ("dag: {}\n", "the 'dag' is empty"),
        ("models:\n  m1: {batch-size: 2}\ndag:\n  m1: []\n", "models.m1 has no 'url'"),
        ("models:\n  batch-size: two\ndag:\n  a: []\n", "models.batch-size must be an integer"),
        ("models:\n  timeout-ms: 1.5\ndag:\n  a: []\n", "must be an integer"),
        ("models:\n  retry-attempts: yes\ndag:\n  a: []\n", "must be an integer"),
        ("models:\n  m1: {url: x, batch_size: 2}\ndag:\n  m1: []\n", "unknown key 'batch_size'"),
        ("models:\n  max-workers: 0\ndag:\n  a: []\n", "at least 1"),
        ("dag:\n  a: b\n", "must be a list"),
        ("dag:\n  'a b': []\n", "invalid node name"),
        ("workflow: x\ndag:\n  a: []\n", "unknown key 'workflow'"),
        ("- a\n", "expected a mapping"),
    ],
)
def test_invalid_specs_are_400s_that_say_why(text: str, message: str) -> None:
    with pytest.raises(InvalidWorkflow, match=re.escape(message)) as caught:
        parse_spec(text)
    assert isinstance(caught.value, InvalidRequest)


def test_a_dag_node_with_no_definition(tmp_path: Path) -> None:
    handler = tmp_path / "handler.py"
    handler.write_text(
        "from helpers import shared as renamed\n"
        "square = lambda data, context: data\n"
        "def pre(data, context):\n    return data\n"
        "async def later(data, context):\n    return data\n"
    )
    assert function_names(handler) == {"renamed", "square", "pre"}
    spec = parse_spec("models:\n  m1: {url: m1.mar}\ndag:\n  pre: [m1]\n  m1: [typo]\n")
    with pytest.raises(InvalidWorkflow, match=r"typo: neither a model .* nor a function"):
        check_function_nodes(spec, handler)
    handler.write_text("def broken(:\n")
    with pytest.raises(InvalidWorkflow, match=re.escape("handler.py:1: syntax error")):
        function_names(handler)


# ------------------------------------------------------------------------- executor


def fake_node(
    outputs: dict[str, bytes], calls: Calls
) -> Callable[[str, list[InputPart], dict[str, str]], Awaitable[bytes]]:
    async def predict_node(node: str, parts: list[InputPart], headers: dict[str, str]) -> bytes:
        calls.append((node, parts, headers))
        return outputs[node]

    return predict_node


CLIENT = [InputPart("body", "image/jpeg", b"jpeg")]


def test_single_parent_gets_body_and_several_parents_get_named_parts() -> None:
    spec = parse_spec("dag:\n  pre: [en, fr]\n  en: [join]\n  fr: [join]\n")
    calls: Calls = []
    outputs = {"pre": b"P", "en": b"E", "fr": b"F", "join": b"not even JSON"}
    answer = run(run_workflow(spec, CLIENT, {"x-a": "1"}, fake_node(outputs, calls)))
    parts = {node: node_parts for node, node_parts, _ in calls}
    assert parts["pre"] == CLIENT
    assert parts["en"] == [InputPart("body", "", b"P")]
    assert parts["join"] == [InputPart("en", "", b"E"), InputPart("fr", "", b"F")]
    assert all(headers == {"x-a": "1"} for _, _, headers in calls)
    # One leaf: its bytes as they are, always answered as JSON.
    assert (answer.body, answer.content_type) == (b"not even JSON", "application/json")


def test_several_leaves_are_combined_into_one_json_object() -> None:
    spec = parse_spec("dag:\n  pre: [a, b]\n")
    outputs = {"pre": b"P", "a": b'{"x": 1}', "b": b'{"y": [2]}'}
    answer = run(run_workflow(spec, CLIENT, {}, fake_node(outputs, [])))
    assert json.loads(answer.body) == {"a": {"x": 1}, "b": {"y": [2]}}


@pytest.mark.parametrize("bad", [b"[1, 2]", b"plain text", b"\xff"])
def test_several_leaves_must_each_answer_a_json_object(bad: bytes) -> None:
    spec = parse_spec("dag:\n  pre: [a, b]\n")
    outputs = {"pre": b"P", "a": b'{"x": 1}', "b": bad}
    with pytest.raises(WorkflowFailed, match="leaf 'b' did not answer a JSON object") as caught:
        run(run_workflow(spec, CLIENT, {}, fake_node(outputs, [])))
    assert caught.value.status == 500


def flaky(failures: int, calls: list[str]) -> Callable[..., Awaitable[bytes]]:
    """A node that fails ``failures`` times, then answers."""

    async def predict_node(node: str, parts: list[InputPart], headers: dict[str, str]) -> bytes:
        calls.append(node)
        if len(calls) <= failures:
            raise HandlerFailed(f"boom {len(calls)}")
        return b"ok"

    return predict_node


def test_a_failing_node_is_retried_then_succeeds() -> None:
    spec = parse_spec("models:\n  retry-attempts: 2\n  m: {url: m.mar}\ndag:\n  m: []\n")
    calls: list[str] = []
    answer = run(run_workflow(spec, CLIENT, {}, flaky(2, calls)))
    assert answer.body == b"ok" and calls == ["m", "m", "m"]


def test_a_node_failing_every_attempt_fails_the_request() -> None:
    spec = parse_spec("models:\n  retry-attempts: 2\n  m: {url: m.mar}\ndag:\n  m: [after]\n")
    calls: list[str] = []
    with pytest.raises(WorkflowNodeFailed) as caught:
        run(run_workflow(spec, CLIENT, {}, flaky(10, calls)))
    error = caught.value
    assert calls == ["m", "m", "m"]  # 1 + retry-attempts, and "after" never ran
    assert error.message.startswith(
        "Failed to execute workflow Node after 3 attempts : Error executing m"
    )
    assert "boom 3" in error.message and error.status == 500
    assert isinstance(error, HandlerFailed)


def test_an_attempt_is_bounded_by_timeout_ms() -> None:
    spec = parse_spec(
        "models:\n  m: {url: m.mar, timeout-ms: 1, retry-attempts: 1}\ndag:\n  m: []\n"
    )
    never = asyncio.Event()
    attempts: list[str] = []

    async def stuck(node: str, parts: list[InputPart], headers: dict[str, str]) -> bytes:
        attempts.append(node)
        await never.wait()
        return b""

    with pytest.raises(WorkflowNodeFailed, match="no answer within 1 ms"):
        run(run_workflow(spec, CLIENT, {}, stuck))
    assert attempts == ["m", "m"]


def test_independent_branches_run_concurrently() -> None:
    """Each branch waits until the other has started: it completes only if both run at once."""
    spec = parse_spec("dag:\n  pre: [a, b]\n  a: [join]\n  b: [join]\n")
    started = {"a": asyncio.Event(), "b": asyncio.Event()}
    finished: list[str] = []

    async def predict_node(node: str, parts: list[InputPart], headers: dict[str, str]) -> bytes:
        if node in started:
            started[node].set()
            await started["b" if node == "a" else "a"].wait()
            finished.append(node)
        if node == "join":
            assert sorted(finished) == ["a", "b"]  # join started after both parents
        return b'{"n": 1}'

    answer = run(run_workflow(spec, CLIENT, {}, predict_node))
    assert answer.body == b'{"n": 1}'


def test_a_failure_cancels_the_nodes_still_running() -> None:
    spec = parse_spec("models:\n  retry-attempts: 0\ndag:\n  pre: [slow, bad]\n")
    cancelled = asyncio.Event()
    slow_started = asyncio.Event()

    async def predict_node(node: str, parts: list[InputPart], headers: dict[str, str]) -> bytes:
        if node == "slow":
            slow_started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        if node == "bad":
            await slow_started.wait()
            raise RuntimeError("bad input")
        return b"{}"

    with pytest.raises(WorkflowNodeFailed, match="Error executing bad"):
        run(run_workflow(spec, CLIENT, {}, predict_node))
    assert cancelled.is_set()


# ------------------------------------------------------------------------------ .war


def workflow_files(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "workflow.yaml"
    spec.write_text("models:\n  m1: {url: m1.mar}\ndag:\n  pre: [m1]\n")
    handler = folder / "handler.py"
    handler.write_text("def pre(data, context):\n    return data\n")
    return spec, handler


def test_war_round_trip(tmp_path: Path) -> None:
    spec_file, handler = workflow_files(tmp_path / "src")
    extra = tmp_path / "src" / "labels.json"
    extra.write_text("{}")
    store = tmp_path / "store"
    war = write_war("my_wf-1.0", spec_file, handler, [extra], store)
    assert war == store / "my_wf-1.0.war"
    with zipfile.ZipFile(war) as zf:
        names = set(zf.namelist())
        manifest = json.loads(zf.read(WAR_MANIFEST_PATH.as_posix()))
    assert names == {"workflow.yaml", "handler.py", "labels.json", "WAR-INF/MANIFEST.json"}
    assert manifest["workflow"] == {
        "workflowName": "my_wf-1.0",
        "specFile": "workflow.yaml",
        "handler": "handler.py",
    }
    day, time = manifest["createdOn"].split(" ")
    assert len(day.split("/")) == 3 and len(time.split(":")) == 3
    assert manifest["archiverVersion"]

    work = tmp_path / "work"
    work.mkdir()
    archive = open_war(store, "my_wf-1.0.war", work, max_unpacked_size=None)
    assert archive.name == "my_wf-1.0"
    assert archive.spec_path.read_text() == spec_file.read_text()
    assert archive.handler_path.name == "handler.py"
    renamed = open_war(store, "my_wf-1.0.war", work, name="renamed", max_unpacked_size=None)
    assert renamed.name == "renamed"
    archive.free()
    assert not archive.folder.exists()


def test_war_writer_refuses_an_existing_archive_without_force(tmp_path: Path) -> None:
    spec_file, handler = workflow_files(tmp_path)
    out = tmp_path / "out"
    write_war("wf", spec_file, handler, [], out)
    with pytest.raises(ArchiveError, match=re.escape("already exists. Please specify --force")):
        write_war("wf", spec_file, handler, [], out)
    assert write_war("wf", spec_file, handler, [], out, force=True) == out / "wf.war"


@pytest.mark.parametrize("name", ["-wf", "w f", "wf/x", ""])
def test_war_writer_checks_the_name(tmp_path: Path, name: str) -> None:
    spec_file, handler = workflow_files(tmp_path)
    with pytest.raises(ArchiveError, match="invalid workflow name"):
        write_war(name, spec_file, handler, [], tmp_path / "out")


def test_war_writer_checks_the_spec_and_its_functions(tmp_path: Path) -> None:
    spec_file, handler = workflow_files(tmp_path)
    handler.write_text("def other(data, context):\n    return data\n")
    message = re.escape("workflow.yaml: dag node pre: neither a model")
    with pytest.raises(ArchiveError, match=message):
        write_war("wf", spec_file, handler, [], tmp_path / "out")
    assert not (tmp_path / "out" / "wf.war").exists()


def write_zip(path: Path, files: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "Missing Workflow entry in manifest file."),
        ({"createdOn": "x"}, "Missing Workflow entry in manifest file."),
        ({"workflow": {"specFile": "s.yaml", "handler": "h.py"}}, "Workflow name is not defined."),
        ({"workflow": {"workflowName": "wf", "handler": "h.py"}}, "no workflow.specFile"),
        (
            {"workflow": {"workflowName": "wf", "specFile": "../s.yaml", "handler": "h.py"}},
            "outside the archive",
        ),
    ],
)
def test_war_manifest_is_checked(
    tmp_path: Path, manifest: dict[str, Any] | None, message: str
) -> None:
    files = {"s.yaml": "dag: {a: []}\n", "h.py": ""}
    if manifest is not None:
        files[WAR_MANIFEST_PATH.as_posix()] = json.dumps(manifest)
    write_zip(tmp_path / "wf.war", files)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(ArchiveError, match=re.escape(message)):
        open_war(tmp_path, "wf.war", work, max_unpacked_size=None)
    assert list(work.iterdir()) == []  # nothing left behind


def test_war_paths_stay_in_the_store(tmp_path: Path) -> None:
    climbing = re.escape("Relative path is not allowed in url: ../x.war")
    with pytest.raises(InvalidRequest, match=climbing):
        open_war(tmp_path, "../x.war", tmp_path, max_unpacked_size=None)
    missing = re.escape("Workflow not found in workflow store: none.war")
    with pytest.raises(WorkflowNotFound, match=missing):
        open_war(tmp_path, "none.war", tmp_path, max_unpacked_size=None)


PADDING = 3_000_000
"""Zero bytes added to a .war: a few KiB on disk, 3 MB unpacked."""
LIMIT = 1 << 20


def padded_war(store: Path, name: str = "wf") -> Path:
    """A valid .war (one model node ``m1``, one function node ``pre``) carrying a
    zero-filled file that unpacks past ``LIMIT``."""
    spec_file, handler = workflow_files(store.parent / f"{name}-src")
    war = write_war(name, spec_file, handler, [], store)
    with zipfile.ZipFile(war, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("padding.bin", bytes(PADDING))
    assert war.stat().st_size < 50_000
    return war


def test_a_war_past_max_unpacked_size_is_refused_as_a_mar_is(tmp_path: Path) -> None:
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    war = padded_war(store)
    (store / "wf.mar").write_bytes(war.read_bytes())
    with pytest.raises(ArchiveError) as as_war:
        open_war(store, "wf.war", work, max_unpacked_size=LIMIT)
    with pytest.raises(ArchiveError) as as_mar:
        open_model(store, "wf.mar", work, max_unpacked_size=LIMIT)
    assert as_war.value.message == "wf.war unpacks to more than 1 MiB (max_unpacked_size); refused"
    assert as_mar.value.message == as_war.value.message.replace("wf.war", "wf.mar")
    assert list(work.iterdir()) == []  # refused before a byte was written, folder removed
    assert open_war(store, "wf.war", work, max_unpacked_size=2 * PADDING).name == "wf"


def test_a_war_entry_climbing_out_is_refused(tmp_path: Path) -> None:
    write_zip(tmp_path / "wf.war", {"../../escaped.txt": "x"})
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(ArchiveError, match="escapes the model folder"):
        open_war(tmp_path, "wf.war", work, max_unpacked_size=LIMIT)
    assert list(work.iterdir()) == [] and not (tmp_path.parent / "escaped.txt").exists()


def test_registering_a_war_applies_the_servers_max_unpacked_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the workflow manager, as ``POST /workflows`` does: the setting reaches the
    .war's extraction (it once did not, and the .war unpacked without a limit)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the service's work folder
    store = tmp_path / "store"
    padded_war(store)
    digest_archive(store, "m1")
    settings = ServerSettings(model_store=store, enable_model_api=True, max_unpacked_size=LIMIT)

    async def scenario() -> None:
        service = FerryService(settings, start_worker=FakeFactory())
        try:
            with pytest.raises(ArchiveError, match=r"wf\.war unpacks to more than 1 MiB"):
                await WorkflowManager(service).register(WorkflowRequest("wf.war"))
            assert list(service.models.work_dir.iterdir()) == []
            assert service.model_names() == []
        finally:
            await service.close()

    run(scenario())


def test_manifest_reader_accepts_torchserve_extras(tmp_path: Path) -> None:
    (tmp_path / "WAR-INF").mkdir()
    (tmp_path / "s.yaml").write_text("dag: {a: []}\n")
    (tmp_path / "h.py").write_text("")
    document = {
        "workflow": {"workflowName": "smtest", "specFile": "s.yaml", "handler": "h.py"},
        "description": "older archivers wrote one",
    }
    (tmp_path / WAR_MANIFEST_PATH).write_text(json.dumps(document))
    assert WarManifest.read(tmp_path).workflow_name == "smtest"
