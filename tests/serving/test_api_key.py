"""The optional API key (``create_app(..., api_key=...)``, ``attnkit serve --api-key``): with it, every request but
the public ones needs ``Authorization: Bearer KEY`` (or, on /translate, LibreTranslate's api_key field: see
test_libretranslate.py); without it, nothing is asked and any Authorization header is ignored. The refusals are
rows of test_errors.py's KEYED_CASES."""

from __future__ import annotations

import pytest

from attnkit.serving.auth import ApiKey, bearer_token

PUBLIC = ["/health", "/ready", "/metrics", "/", "/static/app.js", "/static/style.css", "/openapi.json", "/docs"]


def test_the_key_opens_every_endpoint(keyed_translator_client):
    bearer = {"Authorization": f"Bearer {keyed_translator_client.api_key}"}
    assert keyed_translator_client.get("/info", headers=bearer).json()["task"] == "translator"
    for path, body in [
        ("/v1/translate", {"inputs": "a b"}),
        ("/translate", {"q": "a b"}),
        ("/v1/attention", {"inputs": "a b"}),
    ]:
        assert keyed_translator_client.post(path, json=body, headers=bearer).status_code == 200
    lower_case_scheme = {"Authorization": f"bearer {keyed_translator_client.api_key}"}  # RFC 9110: any case
    assert keyed_translator_client.get("/info", headers=lower_case_scheme).status_code == 200


@pytest.mark.parametrize("path", PUBLIC)
def test_probes_metrics_schema_and_playground_files_need_no_key(keyed_translator_client, path):
    assert keyed_translator_client.get(path).status_code == 200


def test_a_refusal_says_how_to_send_the_key(keyed_translator_client):
    response = keyed_translator_client.get("/info")
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"


def test_without_a_key_nothing_is_asked(translator_client):
    for headers in ({}, {"Authorization": "Bearer anything"}, {"Authorization": "Basic eDp5"}):
        assert translator_client.get("/info", headers=headers).status_code == 200
        assert translator_client.post("/v1/translate", json={"inputs": "a"}, headers=headers).status_code == 200
    assert translator_client.post("/translate", json={"q": "a", "api_key": "whatever"}).status_code == 200


def test_key_comparison():
    key = ApiKey("s3cret")
    assert key.matches(b"s3cret")
    for wrong in (None, b"", b"s3cre", b"s3cret ", b"S3CRET", b"s3cret\x00"):
        assert not key.matches(wrong)
    with pytest.raises(ValueError):
        ApiKey("")
    assert bearer_token([(b"authorization", b"Bearer  abc ")]) == b"abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([(b"authorization", b"Bearer a"), (b"authorization", b"Bearer b")]) == b"a"
    assert bearer_token([]) is None


@pytest.mark.parametrize(
    "key, words",
    [
        ("", "must not be empty or blank"),
        (" ", "must not be empty or blank"),
        ("ab\n", "a control character ('\\n' at character 3)"),  # before, a server no client could ever use
        ("a\x00b", "a control character"),
        ("a\tb", "a control character"),
        ("a\x7fb", "a control character"),
        (" ab", "begins or ends with a space"),
        ("ab ", "begins or ends with a space"),
        ("ab\udcff", "not UTF-8"),  # a byte of an environment variable that is not UTF-8
    ],
)
def test_a_key_no_client_could_send_is_refused(key, words):
    from attnkit.errors import InputError

    with pytest.raises(InputError, match="^the API key: ") as refused:
        ApiKey(key)
    assert words in str(refused.value)
    assert ApiKey("a b é").matches("a b é".encode())  # a space inside and UTF-8 are sent as they are
