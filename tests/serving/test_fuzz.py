"""A schema-driven fuzz run (schemathesis, from the app's own OpenAPI document): whatever a client sends, the
server answers without a 5xx, and every 4xx is the JSON error object."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (the test extra)")
from hypothesis import HealthCheck, settings  # noqa: E402

from attnkit.serving.app import create_app  # noqa: E402
from attnkit.serving.limits import Limits  # noqa: E402
from attnkit.serving.models import load_model  # noqa: E402


def started_schema(model_dir):
    """The app with its lifespan running (the model loaded, the worker started) and its schema; schemathesis then
    calls the same app in-process."""
    from fastapi.testclient import TestClient

    app = create_app(load_model(model_dir), Limits(max_inputs=8, max_beam=4, timeout_s=20))
    client = TestClient(app)
    client.__enter__()
    for _ in range(600):  # bounded: 60 s
        if client.get("/ready").status_code == 200:
            break
        import time

        time.sleep(0.1)
    return client, schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def classifier_schema(classifier_dir):
    client, schema = started_schema(classifier_dir)
    yield schema
    client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def translator_schema(translator_dir):
    client, schema = started_schema(translator_dir)
    yield schema
    client.__exit__(None, None, None)


FUZZ = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def check(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error", "error_type"} and body["error"], body


classifier_api = schemathesis.pytest.from_fixture("classifier_schema")
translator_api = schemathesis.pytest.from_fixture("translator_schema")


@classifier_api.parametrize()
@FUZZ
def test_fuzz_classifier_server(case):
    check(case)


@translator_api.parametrize()
@FUZZ
def test_fuzz_translator_server(case):
    check(case)
