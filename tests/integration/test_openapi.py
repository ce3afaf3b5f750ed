"""The three APIs describe themselves (OpenAPI 3) and serve a self-contained docs page."""

from __future__ import annotations

import httpx

from tests.fixtures.server import RunningServer


def test_api_descriptions_and_docs(main_server: RunningServer) -> None:
    expected = {
        main_server.url: {"/ping", "/predictions/{model_name}"},
        main_server.management_url: {"/models", "/models/{model_name}/{model_version}/set-default"},
        main_server.metrics_url: {"/metrics"},
    }
    for base, paths in expected.items():
        description = httpx.get(f"{base}/api-description").json()
        assert description["openapi"].startswith("3.")
        assert paths <= set(description["paths"])
        assert httpx.request("OPTIONS", f"{base}/").json() == description  # TorchServe's way
        page = httpx.get(f"{base}/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert description["info"]["title"] in page.text and "http" not in page.text.split(
            "<script>"
        )[0].replace("api-description", "")


def test_descriptions_list_every_error_status(main_server: RunningServer) -> None:
    description = httpx.get(f"{main_server.url}/api-description").json()
    responses = description["paths"]["/predictions/{model_name}"]["post"]["responses"]
    assert {"200", "400", "404", "413", "500", "503", "504"} <= set(responses)
