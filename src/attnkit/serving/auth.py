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
import re
from urllib.parse import unquote_to_bytes

from attnkit.errors import InputError

PUBLIC = ("/health", "/ready", "/metrics", "/", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


def needs_key(path: str) -> bool:
    return path not in PUBLIC and not path.startswith("/static/")


def check_key(key: str, source: str = "the API key") -> str:
    """``key`` if a client can send it, else an ``InputError`` naming ``source`` (the option or the environment
    variable it came from). A key with a control character (``ATTNKIT_API_KEY=$'ab\\n'``: a newline ends an HTTP
    header) or with spaces around it (an HTTP parser drops them from a header's value) would start a server that
    answers every request 401."""
    if not key.strip():
        raise InputError(f"{source}: must not be empty or blank")
    for i, char in enumerate(key):
        if ord(char) < 0x20 or char == "\x7f":
            raise InputError(
                f"{source}: has a control character ({char!r} at character {i + 1}), which no client can send "
                "in an HTTP header"
            )
    if key != key.strip(" "):
        raise InputError(f"{source}: begins or ends with a space, which HTTP drops from a header's value")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:  # bytes of an environment variable that are not UTF-8 (Python's surrogateescape)
        raise InputError(f"{source}: is not UTF-8 text") from None
    return key


class ApiKey:
    def __init__(self, key: str):
        self._digest = hashlib.sha256(check_key(key).encode("utf-8")).digest()

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
    """LibreTranslate's ``api_key`` field of a ``/translate`` request, or None where there is none. Read for the key
    alone and leniently, so that whatever else is wrong with the request (a field given twice, malformed JSON, text
    that is not UTF-8) is judged after the key: a client with the key is told what it is (422), one without it only
    that the key is missing (401). Leniency lets no one in: a key found in the body is one the client sent.

    JSON: the ``api_key`` of the parsed body, or where it does not parse, the first ``"api_key": "..."`` in it. A
    form: the first ``api_key`` of the query string, else of the body (Flask's ``request.values.get``), as bytes."""
    if not json_body:
        return _form_key(query) or _form_key(body)
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):  # malformed JSON, text that is not UTF-8, nesting past the parser's limit
        found = _JSON_KEY.search(body)
        try:
            fields = {"api_key": json.loads(found.group(1))} if found else None
        except ValueError:
            return None
    key = fields.get("api_key") if isinstance(fields, dict) else None
    return key.encode("utf-8", "surrogatepass") if isinstance(key, str) else None


# A JSON string value of a field named api_key; a literal "api_key" cannot occur inside another JSON string (its
# quotes would be escaped there).
_JSON_KEY = re.compile(rb'"api_key"\s*:\s*("(?:[^"\\]|\\.)*")')


def _form_key(part: bytes) -> bytes | None:
    """The first ``api_key`` field of a urlencoded ``part``, percent-decoded to bytes (no text decoding: the rest of
    the form may be anything)."""
    for pair in part.split(b"&"):
        name, _, value = pair.partition(b"=")
        if unquote_to_bytes(name.replace(b"+", b" ")) == b"api_key":
            return unquote_to_bytes(value.replace(b"+", b" "))
    return None
