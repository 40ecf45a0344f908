"""Request bodies of the HTTP API, checked by pydantic before a handler runs: wrong types, unknown fields and
impossible decoding parameters are 422s naming the field.

Strict types: ``"beam": "4"`` is refused, not converted, so a client's mistake does not pass silently. Unknown
fields are refused (a typo such as ``beam_size`` would otherwise be ignored), except in the OpenAI and
LibreTranslate shapes, whose clients send fields this server has no use for.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from attnkit.decoding.penalty import LENGTH_PENALTIES

# The largest beam any request may ask for (the server's --max-beam may lower it); past this a request costs
# beam x memory for little gain (§6.1 used 4).
MAX_BEAM = 16

Inputs = StrictStr | list[StrictStr]
Alpha = Annotated[float, Field(ge=0.0, le=10.0, allow_inf_nan=False, strict=True)]


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
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=1)
    user: StrictStr | None = None


class TranslateRequest(_Strict):
    inputs: Inputs
    beam: StrictInt = Field(4, ge=1, le=MAX_BEAM, description="beam size; 1 = greedy (§6.1: 4)")
    alpha: Alpha = Field(0.6, description="length penalty exponent (§6.1: 0.6)")
    length_penalty: Literal[LENGTH_PENALTIES] = "gnmt"  # type: ignore[valid-type]
    n_best: StrictInt = Field(1, ge=1, le=MAX_BEAM, description="how many translations per input, best first")
    truncate: StrictBool = False

    @model_validator(mode="after")
    def _n_best_within_beam(self) -> TranslateRequest:
        if self.n_best > self.beam:
            raise ValueError(f"n_best={self.n_best} must be <= beam={self.beam}")
        return self


class LibreTranslateRequest(BaseModel):
    """LibreTranslate's ``POST /translate``: the model translates one language pair, so source and target are
    accepted as sent (and not checked)."""

    model_config = ConfigDict(extra="ignore")
    q: Inputs
    source: StrictStr = "auto"
    target: StrictStr = ""
    format: Literal["text", "html"] = "text"
    alternatives: StrictInt = Field(0, ge=0, le=MAX_BEAM - 1)
    api_key: StrictStr | None = None


class AttentionRequest(_Strict):
    inputs: StrictStr = Field(description="one text (its length is capped: see /info)")
