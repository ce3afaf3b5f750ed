"""Ferry scraped by a real Prometheus (Debian's, installed by ``make test``'s set-up; the
tests skip, saying so, where it is not): the series the dashboard and the rules read are
there under load, every panel of ``deploy/grafana/ferry-dashboard.json`` returns data
through Prometheus's query API, the recording rules of ``deploy/prometheus/ferry-rules.yml``
evaluate to data, and ``promtool check rules`` accepts the rules."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fixtures.haproxy import free_port
from tests.fixtures.models import digest_archive
from tests.fixtures.polling import HANG_GUARD, wait_until
from tests.fixtures.server import RunningServer, ferry_server

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "ferry-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "ferry-rules.yml"
WINDOW = "30s"
"""What the test gives ``$__rate_interval``: a few of its 1 s scrapes."""

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Prometheus is not installed (apt-get install prometheus; make test installs it "
    "when it runs as root)",
)


def panel_queries() -> list[tuple[str, str]]:
    """Every panel's PromQL (title, query), with Grafana's variables as the test sets them:
    every model, a 30 s rate window."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"].replace("$__rate_interval", WINDOW).replace("$model", ".*"))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def recorded_series() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [
        rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("prometheus")
    store = tmp / "store"
    store.mkdir()
    archive = digest_archive(store, "digest", batchSize=4, maxBatchDelay=5)
    with ferry_server(store, [f"digest={archive}"], tmp) as running:
        yield running


@pytest.fixture(scope="module")
def prometheus(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("prometheus-data")
    target = server.metrics_url.removeprefix("http://")
    rules = tmp / "ferry-rules.yml"
    # Evaluated every second here (15 s as shipped), so the test need not wait for them.
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        group["interval"] = "1s"
    rules.write_text(yaml.safe_dump(document))
    config = tmp / "prometheus.yml"
    scrape = {"job_name": "ferry", "static_configs": [{"targets": [target]}]}
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [scrape],
            }
        )
    )
    port = free_port("127.0.0.1")
    log = tmp / "prometheus.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until("Prometheus to be ready", lambda: _ready(url), process=process, log=log)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=HANG_GUARD)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def query(url: str, promql: str) -> list[Any]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=HANG_GUARD)
    document = answer.json()
    assert document["status"] == "success", (promql, document)
    result: list[Any] = document["data"]["result"]
    return result


@pytest.fixture(scope="module")
def under_load(server: RunningServer, prometheus: str) -> str:
    """Answers and failures for a while, so that rates over the window have data."""

    def post(index: int) -> int:
        body = b"fail" if index % 10 == 0 else b"x%d" % index  # the digest handler fails "fail"
        with httpx.Client(timeout=HANG_GUARD) as client:
            return client.post(f"{server.url}/predictions/digest", content=body).status_code

    def scraped_a_while() -> bool:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(post, range(40)))
        return bool(query(prometheus, "ferry:requests:rate1m > 0")) and bool(
            query(prometheus, f"count_over_time(ferry_queue_depth[{WINDOW}]) > 5")
        )

    wait_until("Prometheus to scrape Ferry under load", scraped_a_while)
    return prometheus


@pytest.mark.parametrize(("title", "promql"), panel_queries(), ids=lambda v: str(v)[:60])
def test_every_dashboard_panel_returns_data(under_load: str, title: str, promql: str) -> None:
    assert query(under_load, promql), f"{title}: no data for {promql}"


@pytest.mark.parametrize("series", recorded_series())
def test_every_recording_rule_evaluates_to_data(under_load: str, series: str) -> None:
    wait_until(f"{series} to be recorded", lambda: bool(query(under_load, series)))


def test_errors_are_counted_by_model_and_outcome(under_load: str) -> None:
    outcomes = {
        series["metric"]["outcome"]
        for series in query(under_load, 'ferry_requests_total{model_name="digest"}')
    }
    assert {"ok", "HandlerFailed"} <= outcomes


def test_promtool_accepts_the_rules() -> None:
    checked = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout
