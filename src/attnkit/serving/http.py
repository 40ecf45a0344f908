"""The JSON error object every failure answers with, and the handlers that turn every exception into one. (The
middleware in front of the app is ``gate.py``.)"""

from __future__ import annotations

import json
import logging
import sys

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnkit.serving.schemas import FORM

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = status, error_type, message, headers


# Handlers return JSONResponse themselves: FastAPI would otherwise walk every answer through jsonable_encoder
# first, which costs more than the model on a small classifier and a lot on attention maps.


def error_response(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status, headers=headers)


def internal_error() -> JSONResponse:
    """The answer to an unexpected exception (logged with its traceback): a bug, never something a client sent."""
    log.exception("unexpected error")
    return error_response(500, "internal_error", "internal server error (a bug: see the server log)")


def validation_message(err: RequestValidationError | ValidationError) -> str:
    """The first problem, with where it is: ``beam: Input should be less than or equal to 16``. Of the errors of one
    field, the deepest is named: for ``"inputs": [1, 2]`` that is ``inputs.0``, not "inputs is not a string"."""
    errors = err.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON ({first.get('ctx', {}).get('error', 'cannot parse')})"
    same_field = [e for e in errors if tuple(e.get("loc", ()))[:2] == tuple(first.get("loc", ()))[:2]]
    chosen = max(same_field, key=lambda e: len(e.get("loc", ())))
    # "body" is where every field is; "str" / "list[str]" name the branch of a union the value failed, not a field.
    parts = [
        str(p)
        for p in chosen.get("loc", ())
        if p != "body"
        and not (isinstance(p, str) and (p in ("str", "int", "float", "bool") or "[" in p or p.startswith("function-")))
    ]
    # A validator's own ValueError: its message, without pydantic's "Value error, " in front.
    message = str(chosen["ctx"]["error"]) if chosen.get("type") == "value_error" else chosen.get("msg", "invalid")
    if not parts and chosen.get("type") == "value_error":  # a check of the whole request: its message names fields
        return message
    return f"{'.'.join(parts) or 'body'}: {message}"


def unparsable_body(cause: BaseException) -> str:
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 text ({cause.reason} at byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "malformed JSON (nested deeper than the parser's recursion limit)"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):  # Python's int_max_str_digits
        return f"a number in the body has more than {sys.get_int_max_str_digits()} digits"
    return f"malformed JSON ({cause})"


def not_utf8(body: bytes) -> str | None:
    """Why a JSON body is refused for its encoding, or None. RFC 8259 §8.1: JSON between systems is UTF-8 (a byte
    order mark may be ignored); Python's parser also guesses UTF-16 and UTF-32, which a client never meant to send
    to an API that promises UTF-8."""
    encoding = json.detect_encoding(body)
    if encoding in ("utf-8", "utf-8-sig"):
        return None
    return f"the body is not UTF-8 text (it reads as {encoding.upper()}); send JSON encoded as UTF-8"


def install_error_handlers(app: FastAPI, form_paths: tuple[str, ...] = ()) -> None:
    """Make every failure answer ``error_response``'s JSON: ``ApiError``s, request validation (422), unknown routes
    and methods (404, 405), and anything unexpected (500, logged: a bug). ``form_paths`` also take a form."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        return error_response(err.status, err.error_type, err.message, err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and "json" not in content_type.lower():
            # curl -d sends application/x-www-form-urlencoded: FastAPI then reads no JSON at all, and its message
            # ("Input should be a valid dictionary") would not say why.
            sent = content_type or "no Content-Type"
            json = "JSON sent with Content-Type: application/json"
            wanted = f"{json} or a form ({FORM})" if request.url.path in form_paths else json
            return error_response(422, "invalid_request", f"the body must be {wanted} (got {sent})")
        return error_response(422, "invalid_request", validation_message(err))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException):
        if err.status_code == 400 and err.__cause__ is not None:
            # FastAPI's "There was an error parsing the body" for a JSON body that Python's parser raised on with
            # something other than a syntax error: bytes that are not UTF-8, nesting past its recursion limit.
            return error_response(422, "invalid_request", unparsable_body(err.__cause__))
        kinds = {404: "not_found", 405: "method_not_allowed"}
        message = {
            404: f"no such endpoint: {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(err.status_code, str(err.detail))
        return error_response(
            err.status_code, kinds.get(err.status_code, "http_error"), message, getattr(err, "headers", None)
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception):
        return internal_error()
