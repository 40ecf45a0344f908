"""Request bodies of the HTTP API, checked by pydantic before a handler runs: wrong types, unknown fields and
impossible decoding parameters are 422s naming the field.

Strict types: ``"beam": "4"`` is refused, not converted, so a client's mistake does not pass silently. Unknown
fields are refused (a typo such as ``beam_size`` would otherwise be ignored), except in the OpenAI and
LibreTranslate shapes, whose clients send fields this server has no use for. Every string must be Unicode text
(``Text``). LibreTranslate's ``/translate`` also takes its fields as a form (``libretranslate_form``).
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import parse_qsl

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from attnkit.decoding.penalty import LENGTH_PENALTIES, MAX_ALPHA
from attnkit.serving.execute import DEFAULT_BEAM


def _unicode(text: str) -> str:
    """JSON may escape a lone UTF-16 surrogate (``"\\ud800"``), which is no character: Python's JSON parser passes
    it on, and the tokenizer (and the UTF-8 of the answer) could not take it. Refused, not replaced: the client's
    text is not what it meant to send."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"not Unicode text: a lone surrogate \\u{ord(text[err.start]):04x} at character {err.start}"
        ) from None
    return text


Text = Annotated[StrictStr, AfterValidator(_unicode)]
Inputs = Text | list[Text]
Alpha = Annotated[float, Field(ge=0.0, le=MAX_ALPHA, allow_inf_nan=False, strict=True)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClassifyRequest(_Strict):
    inputs: Inputs = Field(description="a text or a list of texts")
    truncate: StrictBool = Field(False, description="cut over-long texts instead of refusing them (422)")


class EmbedRequest(_Strict):
    inputs: Inputs
    pool: Literal["mean", "cls"] = "mean"
    normalize: StrictBool = False
    truncate: StrictBool = False


class EmbeddingsRequest(BaseModel):
    """OpenAI's ``POST /v1/embeddings``: the vectors are unit length, as OpenAI's are."""

    model_config = ConfigDict(extra="ignore")
    input: Inputs
    model: Text | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=1)
    user: Text | None = None


class TranslateRequest(_Strict):
    inputs: Inputs
    # beam, n_best and alternatives are bounded by the server's --max-beam (``check_beam``; the OpenAPI document
    # states it as their maximum), not here, so that every beam too large is refused in the same words.
    beam: StrictInt = Field(DEFAULT_BEAM, ge=1, description="beam size; 1 = greedy (§6.1: 4)")
    alpha: Alpha = Field(0.6, description="length penalty exponent (§6.1: 0.6)")
    length_penalty: Literal[LENGTH_PENALTIES] = "gnmt"  # type: ignore[valid-type]
    n_best: StrictInt = Field(1, ge=1, description="how many translations per input, best first")
    truncate: StrictBool = False

    @model_validator(mode="after")
    def _n_best_within_beam(self) -> TranslateRequest:
        if self.n_best > self.beam:
            raise ValueError(f"n_best: {self.n_best} is more than beam={self.beam}; n_best must be <= beam")
        return self


class LibreTranslateRequest(BaseModel):
    """LibreTranslate's ``POST /translate``: the model translates one language pair, so source and target are
    accepted as sent (and not checked)."""

    model_config = ConfigDict(extra="ignore")
    q: Inputs
    source: Text = "auto"
    target: Text = ""
    # LibreTranslate keeps an HTML text's tags and translates the text between them; this model reads plain text
    # and would translate the tags as words, so "html" is refused (it was accepted, and the tags came back lost)
    format: Literal["text"] = "text"
    alternatives: StrictInt = Field(0, ge=0)
    api_key: Text | None = Field(None, description="the server's API key, if it has one (or send it as a Bearer token)")


class LibreTranslateForm(LibreTranslateRequest):
    """The same fields sent as a form: one text, and every value is text, so ``alternatives`` is read as a number."""

    q: Text
    alternatives: int = Field(0, ge=0)


FORM = "application/x-www-form-urlencoded"


def form_fields(query: bytes, body: bytes) -> dict[str, str]:
    """The fields of a LibreTranslate form request, as its server reads them (Flask's ``request.values``): those of
    the URL's query string (some clients send ``POST /translate?q=...`` with no body) and of the urlencoded body.
    ``ValueError`` naming the problem for text that is not UTF-8 and for a field given twice (LibreTranslate would
    keep one value and drop the rest silently; a form carries one text, a JSON list several)."""
    fields: dict[str, str] = {}
    for part in (query, body):
        try:
            pairs = parse_qsl(part.decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict")
        except UnicodeDecodeError as err:
            bad = err.object[err.start : err.end]
            raise ValueError(f"the form is not UTF-8 text ({err.reason}: {bad!r})") from None
        for name, value in pairs:
            if name in fields:
                raise ValueError(f"{name}: given more than once (send JSON with a list for several texts)")
            fields[name] = value
    return fields


def libretranslate_form(query: bytes, body: bytes) -> LibreTranslateForm:
    """The request of a form (``form_fields``); ``ValueError`` or pydantic's ``ValidationError`` naming the field."""
    return LibreTranslateForm.model_validate(form_fields(query, body))


class AttentionRequest(_Strict):
    inputs: Text = Field(description="one text (its length is capped: see /info)")
