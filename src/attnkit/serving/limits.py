"""The server's limits, and the checks of a request's inputs against them (what a client sees as 413 and 422).

The handlers (``routes.py``) validate and tokenize each request with these in the event loop before anything is
queued, so an input the model cannot take never reaches the inference worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.serving.http import ApiError
from attnkit.serving.models import ServedModel


@dataclass(frozen=True)
class Limits:
    """Every limit of the server (``GET /info`` lists them, so clients can chunk their inputs)."""

    max_body_bytes: int = 1_000_000  # request body (413)
    max_inputs: int = 64  # texts per request (413)
    max_chars: int = 10_000  # characters per text (422 unless truncate)
    max_queue: int = 64  # requests waiting for the worker (429 beyond)
    max_batch_tokens: int = 8192  # padded tokens (longest x inputs) per batch
    max_batch_inputs: int = 64  # inputs per batch
    max_wait_ms: float = 0.0  # wait this long for a batch to fill (0: run as soon as the worker is free)
    timeout_s: float = 30.0  # per request, queue included (504)
    max_beam: int = 8  # beam and n_best (422 beyond); at most MAX_BEAM
    attention_max_tokens: int = 64  # /v1/attention input length (422 beyond): the maps grow as its square
    batching: bool = True  # False: one request at a time (the load benchmark's baseline)
    # Slow and idle clients (enforced by ``server.py``): each connection costs a file descriptor until it is closed.
    header_timeout_s: float = 10.0  # a request's line and headers, from connect or the previous answer (408)
    body_timeout_s: float = 30.0  # a request's body, once its headers are in (408)
    max_connections: int = 512  # open connections; beyond, the oldest waiting for a head is closed, else 503


# The largest beam a server may allow (--max-beam): past it a request costs beam x memory for little gain (§6.1
# used 4).
MAX_BEAM = 16


def encode_inputs(
    m: ServedModel,
    inputs: str | list[str],
    truncate: bool | None,
    limits: Limits,
    *,
    field: str = "inputs",
    max_tokens: int | None = None,
) -> tuple[list[str], list[list[int]], list[bool]]:
    """The texts of ``inputs`` (one string or a list, named ``field`` in errors), their token ids and whether each
    was cut: over-long inputs are cut with ``truncate``, refused (422) without it or when ``max_tokens`` caps them;
    empty inputs and too many of them are refused (422, 413). ``truncate`` None: the endpoint has no such field
    (OpenAI's and LibreTranslate's shapes, /v1/attention), so its refusals do not tell the client to send it."""
    hint = ' (send "truncate": true to cut it)' if truncate is not None and max_tokens is None else ""
    texts = [inputs] if isinstance(inputs, str) else list(inputs)
    if not texts:
        raise ApiError(422, "invalid_request", f"{field}: give at least one text")
    if len(texts) > limits.max_inputs:
        raise ApiError(413, "too_many_inputs", f"{field}: {len(texts)} texts; at most {limits.max_inputs} per request")
    cap = max_tokens or m.max_len
    seqs, cut = [], []
    for i, text in enumerate(texts):
        where = f"{field}[{i}]" if not isinstance(inputs, str) else field
        if not text.strip():
            raise ApiError(422, "empty_input", f"{where} is empty")
        was_cut = False
        if len(text) > limits.max_chars:
            if not truncate:
                message = f"{where} has {len(text)} characters; at most {limits.max_chars}{hint}"
                raise ApiError(422, "input_too_long", message)
            text, was_cut = text[: limits.max_chars], True
        ids = m.token_ids(text)
        if len(ids) > cap:
            if not truncate or max_tokens is not None:
                raise ApiError(422, "input_too_long", f"{where} has {len(ids)} tokens; the limit is {cap}{hint}")
            ids, was_cut = m.truncate(ids), True
        texts[i] = text
        seqs.append(ids)
        cut.append(was_cut)
    return texts, seqs, cut


def check_beam(beam: int, n_best: int, limits: Limits) -> None:
    """422 unless 1 <= n_best <= beam <= the server's ``max_beam``."""
    if beam > limits.max_beam:
        raise ApiError(422, "invalid_request", f"beam: {beam} is over this server's limit of {limits.max_beam}")
    if n_best > beam:
        raise ApiError(422, "invalid_request", f"n_best: {n_best} is more than beam={beam}; n_best must be <= beam")
