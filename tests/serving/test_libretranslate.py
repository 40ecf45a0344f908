"""LibreTranslate's ``POST /translate`` as its clients send it: JSON, a urlencoded form (libretranslatepy, curl -d),
or the fields in the query string with no body (deep-translator's ``requests.post(url, params=...)``). Every shape
gets the same answer as the JSON one; the malformed ones are rows of test_errors.py's tables."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

FORM = "application/x-www-form-urlencoded"

FIELDS = {"q": "a b c", "source": "en", "target": "de", "format": "text", "api_key": ""}


def as_json(client, fields: dict):
    return client.post("/translate", json=fields)


def as_form(client, fields: dict):
    return client.post("/translate", content=urlencode(fields), headers={"Content-Type": FORM})


def as_form_with_charset(client, fields: dict):
    return client.post("/translate", content=urlencode(fields), headers={"Content-Type": f"{FORM}; charset=UTF-8"})


def as_query(client, fields: dict):
    return client.post(f"/translate?{urlencode(fields)}")


@pytest.mark.parametrize("send", [as_form, as_form_with_charset, as_query])
def test_a_form_gets_the_answer_of_the_same_fields_as_json(translator_client, send):
    for fields in (FIELDS, {"q": "d e", "alternatives": 2}, {"q": "a b c d e f g h"}):
        want = as_json(translator_client, fields)
        got = send(translator_client, {k: str(v) for k, v in fields.items()})
        assert want.status_code == got.status_code == 200, got.text
        assert got.json() == want.json()
    assert "alternatives" in send(translator_client, {"q": "d e", "alternatives": "2"}).json()


def test_form_text_is_utf8_and_percent_decoded(translator_client):
    text = "a b + c & d = é"
    assert as_form(translator_client, {"q": text}).json() == as_json(translator_client, {"q": text}).json()
    raw = "q=a+é+b".encode()  # not percent-encoded, as curl -d sends it ('+' is still a space)
    got = translator_client.post("/translate", content=raw, headers={"Content-Type": FORM})
    assert got.json() == as_json(translator_client, {"q": "a é b"}).json()


def test_a_form_to_a_server_with_a_key_carries_it(keyed_translator_client):
    key = keyed_translator_client.api_key
    fields = {"q": "a b c", "source": "en", "target": "de"}
    answered = [
        keyed_translator_client.post("/translate", json={**fields, "api_key": key}),
        as_form(keyed_translator_client, {**fields, "api_key": key}),
        as_query(keyed_translator_client, {**fields, "api_key": key}),
        keyed_translator_client.post("/translate", json=fields, headers={"Authorization": f"Bearer {key}"}),
    ]
    assert {r.status_code for r in answered} == {200}
    assert len({r.text for r in answered}) == 1
    assert as_form(keyed_translator_client, fields).status_code == 401


def test_the_schema_describes_the_form(translator_client):
    body = translator_client.get("/openapi.json").json()["paths"]["/translate"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", FORM}
    assert body[FORM]["schema"]["properties"]["q"]["type"] == "string"


def test_html_is_refused_not_translated_with_its_tags_lost(translator_client):
    """LibreTranslate keeps an HTML text's tags; this model reads plain text and lost them, answering 200."""
    for send in (as_json, as_form):
        got = send(translator_client, {"q": "<p>a <b>b</b></p>", "format": "html"})
        assert got.status_code == 422 and got.json()["error"].startswith("format: "), got.text
