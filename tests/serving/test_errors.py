"""Every kind of malformed request gets its 4xx and a message naming the problem, as JSON
``{"error": ..., "error_type": ...}``; never a 500."""

from __future__ import annotations

import pytest

LONG = "x" * 10_001
# (method, path, body: dict, or str sent as raw JSON text, or None) -> (status, error_type, words in the message)
CLASSIFIER_CASES = [
    ("POST", "/v1/classify", "{bad json", 422, "invalid_request", "malformed JSON"),
    ("POST", "/v1/classify", "", 422, "invalid_request", "body: Field required"),
    ("POST", "/v1/classify", "[1, 2]", 422, "invalid_request", "body: Input should be a valid dictionary"),
    ("POST", "/v1/classify", "null", 422, "invalid_request", "body: Input should be a valid dictionary"),
    ("POST", "/v1/classify", {}, 422, "invalid_request", "inputs: Field required"),
    ("POST", "/v1/classify", {"inputs": 3}, 422, "invalid_request", "inputs"),
    ("POST", "/v1/classify", {"inputs": None}, 422, "invalid_request", "inputs"),
    ("POST", "/v1/classify", {"inputs": [1, 2]}, 422, "invalid_request", "inputs.0"),
    ("POST", "/v1/classify", {"inputs": ["ok", None]}, 422, "invalid_request", "inputs.1"),
    ("POST", "/v1/classify", {"inputs": {"a": 1}}, 422, "invalid_request", "inputs"),
    ("POST", "/v1/classify", {"inputs": "good", "truncate": "yes"}, 422, "invalid_request", "truncate"),
    ("POST", "/v1/classify", {"inputs": "good", "trunc": True}, 422, "invalid_request", "trunc: Extra inputs"),
    ("POST", "/v1/classify", {"inputs": ""}, 422, "empty_input", "inputs is empty"),
    ("POST", "/v1/classify", {"inputs": "   "}, 422, "empty_input", "inputs is empty"),
    ("POST", "/v1/classify", {"inputs": ["ok", ""]}, 422, "empty_input", "inputs[1] is empty"),
    ("POST", "/v1/classify", {"inputs": []}, 422, "invalid_request", "at least one text"),
    ("POST", "/v1/classify", {"inputs": ["ok"] * 65}, 413, "too_many_inputs", "65 texts; at most 64"),
    ("POST", "/v1/classify", {"inputs": LONG}, 422, "input_too_long", "10001 characters; at most 10000"),
    ("POST", "/v1/classify", {"inputs": "good " * 40}, 422, "input_too_long", "40 tokens; the limit is 32"),
    ("POST", "/v1/classify", {"inputs": ["good", "good " * 40]}, 422, "input_too_long", "inputs[1] has 40 tokens"),
    ("POST", "/v1/classify", "x" * 1_000_001, 413, "body_too_large", "over 1000000 bytes"),
    ("GET", "/v1/classify", None, 405, "method_not_allowed", "GET is not allowed on /v1/classify"),
    ("GET", "/v2/classify", None, 404, "not_found", "no such endpoint: /v2/classify"),
    ("POST", "/health", {}, 405, "method_not_allowed", "POST is not allowed"),
    ("DELETE", "/v1/embed", None, 405, "method_not_allowed", "DELETE is not allowed"),
    ("POST", "/v1/embed", {"inputs": "good", "pool": "max"}, 422, "invalid_request", "pool"),
    ("POST", "/v1/embed", {"inputs": "good", "normalize": 1}, 422, "invalid_request", "normalize"),
    ("POST", "/v1/embeddings", {"input": [[1, 2, 3]]}, 422, "invalid_request", "input"),
    ("POST", "/v1/embeddings", {"input": "good", "encoding_format": "int8"}, 422, "invalid_request", "encoding_format"),
    ("POST", "/v1/embeddings", {"input": "good", "dimensions": 7}, 422, "invalid_request", "have 16"),
    ("POST", "/v1/embeddings", {"input": "good " * 40}, 422, "input_too_long", "input has 40 tokens"),
    ("POST", "/v1/attention", {"inputs": ["a", "b"]}, 422, "invalid_request", "inputs"),
    ("POST", "/v1/attention", {"inputs": "good " * 33}, 422, "input_too_long", "33 tokens; the limit is 32"),
    ("POST", "/v1/translate", {"inputs": "good"}, 400, "wrong_model", "needs a translator"),
]
TRANSLATOR_CASES = [
    ("POST", "/v1/translate", {"inputs": "a b", "beam": 0}, 422, "invalid_request", "beam: Input should be greater"),
    ("POST", "/v1/translate", {"inputs": "a b", "beam": 9}, 422, "invalid_request", "over this server's limit of 8"),
    ("POST", "/v1/translate", {"inputs": "a b", "beam": 100}, 422, "invalid_request", "beam"),
    (
        "POST",
        "/v1/translate",
        {"inputs": "a b", "beam": "4"},
        422,
        "invalid_request",
        "beam: Input should be a valid integer",
    ),
    ("POST", "/v1/translate", {"inputs": "a b", "beam": 2.5}, 422, "invalid_request", "beam"),
    ("POST", "/v1/translate", {"inputs": "a b", "alpha": -0.1}, 422, "invalid_request", "alpha"),
    ("POST", "/v1/translate", '{"inputs": "a b", "alpha": NaN}', 422, "invalid_request", "alpha"),
    ("POST", "/v1/translate", {"inputs": "a b", "alpha": "0.6"}, 422, "invalid_request", "alpha"),
    ("POST", "/v1/translate", {"inputs": "a b", "length_penalty": "avg"}, 422, "invalid_request", "length_penalty"),
    (
        "POST",
        "/v1/translate",
        {"inputs": "a b", "beam": 2, "n_best": 3},
        422,
        "invalid_request",
        "n_best=3 must be <= beam=2",
    ),
    ("POST", "/v1/translate", {"inputs": "a b", "n_best": 0}, 422, "invalid_request", "n_best"),
    ("POST", "/v1/translate", {"inputs": "a b", "beam_size": 4}, 422, "invalid_request", "beam_size: Extra inputs"),
    ("POST", "/v1/translate", {"inputs": "a " * 40}, 422, "input_too_long", "41 tokens; the limit is 32"),
    ("POST", "/translate", {"source": "en"}, 422, "invalid_request", "q: Field required"),
    ("POST", "/translate", {"q": 5}, 422, "invalid_request", "q"),
    ("POST", "/translate", {"q": "a", "alternatives": -1}, 422, "invalid_request", "alternatives"),
    ("POST", "/translate", {"q": "a", "alternatives": 9}, 422, "invalid_request", "over this server's limit of 8"),
    ("POST", "/translate", {"q": "a", "format": "pdf"}, 422, "invalid_request", "format"),
    ("POST", "/v1/classify", {"inputs": "a"}, 400, "wrong_model", "needs a classifier"),
    ("POST", "/v1/embed", {"inputs": "a"}, 400, "wrong_model", "needs a classifier or embedder"),
]


def check(client, method, path, body, status, error_type, words):
    if body is None:
        response = client.request(method, path)
    elif isinstance(body, str):
        response = client.request(method, path, content=body.encode(), headers={"content-type": "application/json"})
    else:
        response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
    payload = response.json()
    assert set(payload) == {"error", "error_type"}, payload
    assert payload["error_type"] == error_type, payload
    assert words in payload["error"], payload


@pytest.mark.parametrize("case", CLASSIFIER_CASES, ids=lambda c: f"{c[0]} {c[1]} {str(c[2])[:40]}")
def test_malformed_request_to_a_classifier(classifier_client, case):
    check(classifier_client, *case)


@pytest.mark.parametrize("case", TRANSLATOR_CASES, ids=lambda c: f"{c[0]} {c[1]} {str(c[2])[:40]}")
def test_malformed_request_to_a_translator(translator_client, case):
    check(translator_client, *case)


def test_the_table_covers_at_least_30_malformed_requests():
    assert len(CLASSIFIER_CASES) + len(TRANSLATOR_CASES) >= 30


def test_truncate_allows_an_over_long_text(classifier_client):
    response = classifier_client.post("/v1/classify", json={"inputs": LONG[:20_000], "truncate": True})
    assert response.status_code == 200 and response.json()["results"][0]["truncated"]


def test_chunked_body_over_the_limit_is_refused_without_content_length(classifier_client):
    def chunks():
        for _ in range(20):
            yield b"x" * 100_000

    response = classifier_client.post("/v1/classify", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error_type"] == "body_too_large"


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_json_body_without_the_json_content_type_says_so(classifier_client, content_type):
    """What ``curl -d '{...}'`` sends (form-urlencoded), or no type at all: the 422 names the header to send."""
    headers = {"content-type": content_type} if content_type else {}
    response = classifier_client.post("/v1/classify", content=b'{"inputs": "a fine film"}', headers=headers)
    assert response.status_code == 422
    assert response.json()["error_type"] == "invalid_request"
    assert "Content-Type: application/json" in response.json()["error"]
    assert (content_type or "no Content-Type") in response.json()["error"]
