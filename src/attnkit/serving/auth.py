"""The optional API key (``attnkit serve --api-key``, or ``ATTNKIT_API_KEY``): which requests need it, and how a
key a client sent is found and checked.

As TEI's ``--api-key`` does: ``Authorization: Bearer KEY`` on every request but the probes (``/health``,
``/ready``), the metrics, the API's description and the playground's files, which carry no data of the model. On
LibreTranslate's ``/translate`` the key may also come in LibreTranslate's ``api_key`` field (JSON, form or query
string), which its clients send instead of a header.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from attnkit.serving.schemas import form_fields

PUBLIC = ("/health", "/ready", "/metrics", "/", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


def needs_key(path: str) -> bool:
    return path not in PUBLIC and not path.startswith("/static/")


class ApiKey:
    def __init__(self, key: str):
        if not key:
            raise ValueError("an API key must not be empty")
        self._digest = hashlib.sha256(key.encode()).digest()

    def matches(self, candidate: bytes | None) -> bool:
        """Whether ``candidate`` is the key, in time that depends on neither (both are hashed to 32 bytes first, so
        not even the key's length shows)."""
        if candidate is None:
            return False
        return hmac.compare_digest(hashlib.sha256(candidate).digest(), self._digest)


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the first ``Authorization: Bearer TOKEN`` header (the scheme's case does not matter, RFC 9110
    §11.1), or None."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


def libretranslate_key(json_body: bool, query: bytes, body: bytes) -> bytes | None:
    """LibreTranslate's ``api_key`` field of a ``/translate`` request: from the JSON body, or from the form and the
    query string. None where there is none, or the request cannot be read (it gets a 401, not a 422: a client
    without the key learns nothing about its request)."""
    try:
        if json_body:
            fields = json.loads(body)
            key = fields.get("api_key") if isinstance(fields, dict) else None
        else:
            key = form_fields(query, body).get("api_key")
    except (ValueError, RecursionError):  # malformed JSON, text that is not UTF-8, nesting past the parser's limit
        return None
    return key.encode("utf-8", "surrogatepass") if isinstance(key, str) else None
