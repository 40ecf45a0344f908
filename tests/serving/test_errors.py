"""Every kind of malformed request gets its 4xx and a message naming the problem, as JSON
``{"error": ..., "error_type": ...}``; never a 500. The tables of requests that reach the app are here; those of
connections that never finish a request (slow heads and bodies, which need a real server) are in
test_slow_clients.py."""

from __future__ import annotations

import gzip

import pytest

FORM = "application/x-www-form-urlencoded"


class Form(str):
    """A body sent as it is with Content-Type: application/x-www-form-urlencoded (LibreTranslate's clients)."""


LONG = "x" * 10_001
SURROGATE = r'"\ud800"'  # JSON text of a string holding a lone UTF-16 surrogate, which is no character
DEEP = "[" * 100_000 + "]" * 100_000  # past the recursion limit of Python's JSON parser (and pydantic's)
# (method, path, body, status, error_type, words in the message[, request headers]); the body is a dict (sent as
# JSON), a str (raw JSON text), bytes (raw, as application/json), a Form, or None (no body).
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
    # JSON is UTF-8 between systems (RFC 8259 §8.1): Python's parser guessed UTF-16 and answered 200.
    ("POST", "/v1/classify", '{"inputs": "abc"}'.encode("utf-16"), 422, "invalid_request", "reads as UTF-16"),
    ("POST", "/v1/classify", '{"inputs": "abc"}'.encode("utf-16-le"), 422, "invalid_request", "not UTF-8"),
    ("POST", "/v1/classify", b"\xef\xbb\xbf" + b'{"inputs": "abc", "x": 1}', 422, "invalid_request", "x: Extra"),
    # Valid JSON whose number Python will not read: the limit named, not the parser's advice to raise it.
    (
        "POST",
        "/v1/classify",
        '{"inputs": "a", "truncate": ' + "9" * 5000 + "}",
        422,
        "invalid_request",
        "a number in the body has more than 4300 digits",
    ),
    ("POST", "/v1/classify", {"inputs": LONG}, 422, "input_too_long", "10001 characters; at most 10000"),
    ("POST", "/v1/classify", {"inputs": "good " * 40}, 422, "input_too_long", "40 tokens; the limit is 32"),
    ("POST", "/v1/classify", {"inputs": ["good", "good " * 40]}, 422, "input_too_long", "inputs[1] has 40 tokens"),
    ("POST", "/v1/classify", "x" * 1_000_001, 413, "body_too_large", "over 1000000 bytes"),
    ("POST", "/v1/classify", f'{{"inputs": {SURROGATE}}}', 422, "invalid_request", "inputs: not Unicode text"),
    ("POST", "/v1/classify", f'{{"inputs": ["ok", {SURROGATE}]}}', 422, "invalid_request", "inputs.1: not Unicode"),
    ("POST", "/v1/attention", f'{{"inputs": {SURROGATE}}}', 422, "invalid_request", "lone surrogate \\ud800"),
    ("POST", "/v1/embeddings", f'{{"input": "a", "model": {SURROGATE}}}', 422, "invalid_request", "model: not"),
    ("POST", "/v1/classify", b'{"inputs": "caf\xe9"}', 422, "invalid_request", "not UTF-8 text"),
    ("POST", "/v1/classify", b'\xff\xfe{"inputs": "a"}', 422, "invalid_request", "not UTF-8 text"),
    ("POST", "/v1/classify", DEEP, 422, "invalid_request", "malformed JSON (nested deeper"),
    ("POST", "/v1/classify", '{"inputs": ' + DEEP + "}", 422, "invalid_request", "malformed JSON (nested deeper"),
    ("POST", "/v1/classify", Form("inputs=a+fine+film"), 422, "invalid_request", "must be JSON"),
    # a query string on a JSON endpoint was ignored (the default beam ran), where an unknown body field is refused
    ("POST", "/v1/classify?truncate=true", {"inputs": "ok"}, 422, "invalid_request", "query string (truncate): not"),
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
    # Past the largest beam any server allows, in the same words as past this server's (it said "<= 16").
    (
        "POST",
        "/v1/translate",
        {"inputs": "a b", "beam": 100},
        422,
        "invalid_request",
        "beam: 100 is over this server's limit of 8",
    ),
    (
        "POST",
        "/v1/translate",
        {"inputs": "a b", "beam": 4, "n_best": 17},
        422,
        "invalid_request",
        "n_best: 17 is more than beam=4; n_best must be <= beam",
    ),
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
        "n_best: 3 is more than beam=2; n_best must be <= beam",
    ),
    ("POST", "/v1/translate", {"inputs": "a b", "n_best": 0}, 422, "invalid_request", "n_best"),
    ("POST", "/v1/translate", {"inputs": "a b", "beam_size": 4}, 422, "invalid_request", "beam_size: Extra inputs"),
    ("POST", "/v1/translate", {"inputs": "a " * 40}, 422, "input_too_long", "41 tokens; the limit is 32"),
    ("POST", "/translate", {"source": "en"}, 422, "invalid_request", "q: Field required"),
    ("POST", "/translate", {"q": 5}, 422, "invalid_request", "q"),
    ("POST", "/translate", {"q": "a", "alternatives": -1}, 422, "invalid_request", "alternatives"),
    (
        "POST",
        "/translate",
        {"q": "a", "alternatives": 8},
        422,
        "invalid_request",
        "alternatives: 8 is over this server's limit of 7",
    ),
    ("POST", "/translate", {"q": "a", "format": "pdf"}, 422, "invalid_request", "format"),
    ("POST", "/v1/translate", f'{{"inputs": {SURROGATE}}}', 422, "invalid_request", "inputs: not Unicode text"),
    ("POST", "/translate", f'{{"q": {SURROGATE}}}', 422, "invalid_request", "q: not Unicode text"),
    ("POST", "/translate", f'{{"q": "a", "target": {SURROGATE}}}', 422, "invalid_request", "target: not Unicode"),
    ("POST", "/v1/attention", f'{{"inputs": {SURROGATE}}}', 422, "invalid_request", "inputs: not Unicode text"),
    ("POST", "/translate", b'{"q": "\xc3"}', 422, "invalid_request", "not UTF-8 text"),
    ("POST", "/translate", Form("source=en&target=de"), 422, "invalid_request", "q: Field required"),
    ("POST", "/translate", Form("q=a&q=b"), 422, "invalid_request", "q: given more than once"),
    ("POST", "/translate", Form("q=a&alternatives=two"), 422, "invalid_request", "alternatives: Input should be"),
    (
        "POST",
        "/translate",
        Form("q=a&alternatives=9"),
        422,
        "invalid_request",
        "alternatives: 9 is over this server's limit of 7",
    ),
    ("POST", "/translate", Form("q=a&format=pdf"), 422, "invalid_request", "format"),
    ("POST", "/translate", Form("q=%FF"), 422, "invalid_request", "the form is not UTF-8 text"),
    ("POST", "/translate", Form("q=%ED%A0%80"), 422, "invalid_request", "the form is not UTF-8 text"),  # a surrogate
    ("POST", "/translate", Form("q="), 422, "empty_input", "q is empty"),
    ("POST", "/translate", Form('{"q": "a"}'), 422, "invalid_request", "q: Field required"),  # curl -d '{...}'
    ("POST", "/translate?q=a&q=b", None, 422, "invalid_request", "q: given more than once"),
    (
        "POST",
        "/translate",
        b'--x\r\nContent-Disposition: form-data; name="q"\r\n\r\na\r\n--x--\r\n',  # what LibreTranslate's page sends
        422,
        "invalid_request",
        "must be JSON sent with Content-Type: application/json or a form (application/x-www-form-urlencoded) (got "
        "multipart/form-data; boundary=x)",
        {"content-type": "multipart/form-data; boundary=x"},
    ),
    ("POST", "/translate?source=en", Form("q=a&source=de"), 422, "invalid_request", "source: given more than once"),
    ("POST", "/v1/classify", {"inputs": "a"}, 400, "wrong_model", "needs a classifier"),
    # A body with a content coding, or a transfer coding other than chunked, is refused unread (before, gzip bytes
    # got 422 "not UTF-8" and a br label on a plain body passed).
    (
        "POST",
        "/v1/translate",
        gzip.compress(b'{"inputs": "a"}'),
        415,
        "unsupported_encoding",
        "Content-Encoding: gzip",
        {"content-encoding": "gzip"},
    ),
    (
        "POST",
        "/v1/translate",
        {"inputs": "a"},
        415,
        "unsupported_encoding",
        "Content-Encoding: br is not",
        {"content-encoding": "br"},
    ),
    (
        "POST",
        "/translate",
        Form("q=a"),
        415,
        "unsupported_encoding",
        "identity, deflate",
        {"content-encoding": "identity, deflate"},
    ),
    (
        "POST",
        "/v1/translate",
        {"inputs": "a"},
        501,
        "not_implemented",
        "Transfer-Encoding: gzip, chunked",
        {"transfer-encoding": "gzip, chunked"},
    ),
    ("POST", "/v1/embed", {"inputs": "a"}, 400, "wrong_model", "needs a classifier or embedder"),
]


def check(client, method, path, body, status, error_type, words, headers=None):
    headers = dict(headers or {})
    if body is None:
        response = client.request(method, path, headers=headers)
    elif isinstance(body, Form):
        raw = body.encode("utf-8", "surrogateescape")  # "\udce9": the byte 0xe9, which is not UTF-8
        response = client.request(method, path, content=raw, headers={"content-type": FORM, **headers})
    elif isinstance(body, (str, bytes)):
        raw = body.encode() if isinstance(body, str) else body
        response = client.request(method, path, content=raw, headers={"content-type": "application/json", **headers})
    else:
        response = client.request(method, path, json=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["x-content-type-options"] == "nosniff"
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


KEY = "open sesame"  # conftest's keyed_translator_client has it
# The same, to a translator whose server needs an API key: without it, or with a wrong one, every request but the
# public ones is a 401 (before anything else is looked at, but on /translate the size of the body that may carry
# the key); with it, the request is judged as usual.
KEYED_CASES = [
    ("POST", "/v1/translate", {"inputs": "a b"}, 401, "unauthorized", "this server needs an API key"),
    ("GET", "/info", None, 401, "unauthorized", "send Authorization: Bearer KEY"),
    ("POST", "/v1/classify", {"inputs": "a"}, 401, "unauthorized", "needs an API key"),  # 401 before 400
    ("POST", "/v1/translate", {"inputs": "a"}, 401, "unauthorized", "wrong API key", {"Authorization": "Bearer no"}),
    ("POST", "/v1/translate", {"inputs": "a"}, 401, "unauthorized", "wrong", {"Authorization": f"Bearer {KEY}x"}),
    ("POST", "/v1/translate", {"inputs": "a"}, 401, "unauthorized", "wrong", {"Authorization": f"Basic {KEY}"}),
    ("POST", "/v1/translate", {"inputs": "a", "api_key": KEY}, 401, "unauthorized", "needs an API key"),
    ("POST", "/translate", {"q": "a"}, 401, "unauthorized", "or the api_key field"),
    ("POST", "/translate", {"q": "a", "api_key": "no"}, 401, "unauthorized", "missing or wrong API key"),
    ("POST", "/translate", {"q": "a", "api_key": 5}, 401, "unauthorized", "missing or wrong API key"),
    ("POST", "/translate", '{"q": "a", "api_key": "' + KEY, 401, "unauthorized", "missing or wrong API key"),
    ("POST", "/translate", Form("q=a&api_key=no"), 401, "unauthorized", "missing or wrong API key"),
    ("POST", "/translate?q=a&api_key=no", None, 401, "unauthorized", "missing or wrong API key"),
    ("POST", "/translate", {"q": 5, "api_key": KEY}, 422, "invalid_request", "q"),
    # The key is found in a body that is wrong otherwise, and the request is then judged as usual (issue: a 401).
    ("POST", "/translate", Form("q=a&q=b&api_key=open+sesame"), 422, "invalid_request", "q: given more than once"),
    ("POST", "/translate", Form("q=caf\udce9&api_key=open+sesame"), 422, "invalid_request", "form is not UTF-8"),
    ("POST", "/translate", '{"q": "a", "api_key": "' + KEY + '",}', 422, "invalid_request", "malformed JSON"),
    ("POST", "/translate", b'{"q": "caf\xe9", "api_key": "open sesame"}', 422, "invalid_request", "not UTF-8"),
    ("POST", "/translate", Form("q=a&q=b&api_key=no"), 401, "unauthorized", "missing or wrong API key"),
    # A body the server will not read for the key: refused as such (a key in the header is looked at first).
    ("POST", "/translate", {"q": "x" * 1_000_000}, 413, "body_too_large", "over 1000000 bytes"),
    ("POST", "/v1/translate", {"inputs": "x" * 1_000_000}, 401, "unauthorized", "needs an API key"),
    ("POST", "/translate", '{"q": "a", "api_key": "no",}', 401, "unauthorized", "missing or wrong API key"),
    ("POST", "/translate", Form("alternatives=1&api_key=open+sesame"), 422, "invalid_request", "q: Field required"),
    (
        "POST",
        "/v1/translate",
        {"inputs": "a", "beam": 0},
        422,
        "invalid_request",
        "beam",
        {"Authorization": f"Bearer {KEY}"},
    ),
    (
        "POST",
        "/v1/translate",
        {"inputs": "a", "api_key": KEY},
        422,
        "invalid_request",
        "api_key: Extra inputs",
        {"Authorization": f"Bearer {KEY}"},
    ),
]


@pytest.mark.parametrize("case", KEYED_CASES, ids=lambda c: f"{c[0]} {c[1]} {str(c[2])[:40]} {c[6:]}")
def test_malformed_request_to_a_server_with_an_api_key(keyed_translator_client, case):
    assert keyed_translator_client.api_key == KEY
    check(keyed_translator_client, *case)


def test_the_table_covers_at_least_30_malformed_requests():
    assert len(CLASSIFIER_CASES) + len(TRANSLATOR_CASES) >= 30


@pytest.mark.parametrize(
    "client, path, body, words",
    [
        ("classifier_client", "/v1/embeddings", {"input": "good " * 40}, "input has 40 tokens; the limit is 32"),
        ("classifier_client", "/v1/embeddings", {"input": LONG}, "input has 10001 characters; at most 10000"),
        ("classifier_client", "/v1/attention", {"inputs": LONG}, "inputs has 10001 characters; at most 10000"),
        ("translator_client", "/translate", {"q": "a " * 40}, "q has 41 tokens; the limit is 32"),
        ("translator_client", "/translate", {"q": ["a", LONG]}, "q[1] has 10001 characters; at most 10000"),
    ],
)
def test_an_over_long_text_for_an_endpoint_without_truncate_is_not_told_to_send_it(request, client, path, body, words):
    """OpenAI's and LibreTranslate's shapes have no truncate field (theirs refuse over-long texts too), and
    /v1/attention's cap is fixed: a hint to send "truncate": true would get the same answer (before, it was given)."""
    response = request.getfixturevalue(client).post(path, json=body)
    assert response.status_code == 422 and response.json() == {"error": words, "error_type": "input_too_long"}


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


def test_utf16_json_is_refused_under_a_plus_json_type_too(classifier_client):
    """FastAPI reads `application/merge-patch+json` as JSON: a UTF-16 body under it was guessed and answered 200."""
    body = '{"inputs": "a fine film"}'.encode("utf-16")
    response = classifier_client.post("/v1/classify", content=body, headers={"content-type": "application/x+json"})
    assert response.status_code == 422 and "UTF-16" in response.json()["error"], response.text
