"""The inference worker process (``attnkit serve``'s default): it answers as the in-process model does (the
CLI-equality tests in test_batching.py run both), reports a failed load through /ready, turns a dead worker into
503s rather than hung or 500 requests, survives an error in one batch, and never outlives the server."""

from __future__ import annotations

import pytest

from attnkit.errors import InputError
from attnkit.serving.models import load_model
from attnkit.serving.worker import ProcessRunner, WorkerDied


def test_a_model_the_worker_cannot_load_is_reported_by_ready(classifier_dir, tmp_path):
    from fastapi.testclient import TestClient

    from attnkit.serving.app import create_app

    runner = ProcessRunner(str(tmp_path / "missing"), threads=1)
    with TestClient(create_app(load_model(classifier_dir), runner=runner)) as client:
        for _ in range(600):  # bounded: 60 s for the child to start and fail
            answer = client.get("/ready")
            if "failed" in answer.json()["error"]:
                break
            import time

            time.sleep(0.1)
        assert answer.status_code == 503
        assert "missing: no such directory" in answer.json()["error"]
        refused = client.post("/v1/classify", json={"inputs": "a fine film"})
        assert refused.status_code == 503 and refused.json()["error_type"] == "not_ready"


def test_a_killed_worker_turns_into_503s_and_ready_says_so(classifier_dir, serve_client):
    with serve_client(classifier_dir, "process") as client:
        assert client.post("/v1/classify", json={"inputs": "a fine film"}).status_code == 200
        runner = client.app.state.runner
        runner._process.kill()
        runner._process.join(10)
        answer = client.post("/v1/classify", json={"inputs": "a fine film"})
        assert answer.status_code == 503, answer.text
        assert answer.json()["error_type"] == "not_ready" and "ended" in answer.json()["error"]
        assert client.get("/ready").status_code == 503
    assert runner._process is None  # closed with the app


def test_an_error_in_one_batch_is_raised_in_the_server_and_the_worker_goes_on(classifier_dir):
    runner = ProcessRunner(str(classifier_dir), threads=1)
    runner.start()
    try:
        with pytest.raises(RuntimeError, match="inference failed in the worker process: AttributeError"):
            runner(("translate", 1, 0.6, "gnmt", 1), [[[5, 6, 7]]])  # a classifier cannot translate
        probs = runner(("classify",), [[[5, 6, 7]], [[8, 9]]])
        assert len(probs) == 2 and all(abs(sum(p[0]) - 1) < 1e-6 for p in probs)
        child = runner._process
    finally:
        runner.close()
    assert child is not None and not child.is_alive()
    with pytest.raises(WorkerDied, match="not running"):
        runner(("classify",), [[[5, 6, 7]]])


def test_a_clients_mistake_found_in_the_worker_stays_an_input_error():
    from attnkit.serving.worker import _rebuild

    assert isinstance(_rebuild("input_error", "too long"), InputError)
    assert isinstance(_rebuild("value_error", "bad"), ValueError)
    assert not isinstance(_rebuild("error", "bug"), ValueError)


def test_info_reports_the_precision_and_device_the_worker_runs_in(translator_dir):
    """The server keeps a float32 CPU copy for tokenization; /info names what the child computes in."""
    from fastapi.testclient import TestClient

    from attnkit.serving.app import create_app

    runner = ProcessRunner(str(translator_dir), precision="bf16", threads=1)
    with TestClient(create_app(load_model(translator_dir), runner=runner)) as client:
        for _ in range(600):  # bounded: 60 s
            if client.get("/ready").status_code == 200:
                break
            import time

            time.sleep(0.1)
        info = client.get("/info").json()
    assert info["inference"] == {"precision": "bf16", "device": "cpu", "engine": "eager", "worker": "process"}


def test_the_warm_up_runs_both_searches_a_request_may_take_before_the_first_client(translator_dir):
    """A translator is warmed up greedily and with the beam a request gets when it names none: each search is a
    step of its own (its own CUDA graph or compiled program), which the first client would otherwise pay for."""
    from attnkit.serving.execute import DEFAULT_BEAM, warm_up
    from attnkit.serving.models import TranslatorModel
    from attnkit.serving.schemas import TranslateRequest

    served = load_model(translator_dir)
    assert isinstance(served, TranslatorModel)
    beams = []
    translate = served.translate

    def recorded(seqs, *, beam, **options):
        beams.append(beam)
        return translate(seqs, beam=beam, **options)

    served.translate = recorded  # type: ignore[method-assign]
    warm_up(served)
    assert beams == [1, DEFAULT_BEAM]
    assert TranslateRequest.model_validate({"inputs": "hello"}).beam == DEFAULT_BEAM
