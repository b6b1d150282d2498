"""Request and response schemas of the HTTP API (pydantic), including the OpenAI embeddings schema.

Requests are strict: unknown fields, wrong types and impossible values are refused with 422 and a message that
names the field (the OpenAI request ignores unknown fields, as OpenAI's own API does). Every error answer has
one shape, OpenAI's: {"error": {"message": ..., "type": ..., "code": ..., "param": ...}}, so the `openai`
client raises a readable `openai.BadRequestError` and the like.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ErrorInfo(BaseModel):
    message: str = Field(description="what was wrong, for people")
    type: str = Field(description="invalid_request_error, authentication_error or server_error")
    code: str | None = Field(None, description="what was wrong, for programs (e.g. body_too_large)")
    param: str | None = Field(None, description="the request field at fault, if one is")


class ErrorResponse(BaseModel):
    """OpenAI's error shape, the body of every 4xx and 5xx answer."""

    error: ErrorInfo


class ApiError(Exception):
    """An error answer: HTTP status, a message for people, an error type and code for programs."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, code=self.code, param=self.param)).model_dump()


def json_type(obj) -> str:
    """The JSON name of a parsed JSON value's type (array, object, string, number, boolean, null)."""
    return {list: "array", dict: "object", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(obj), type(obj).__name__)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


ModelTau = Field(description="the model's own threshold (the paper's tau, config.json), what a request's tau rule replaces; the "
                            "active questions follow `budget`, which may be another rule (top12>0.5: the 12 surest above 0.5)")
Tau = Field(None, gt=0, lt=1, allow_inf_nan=False,
            description="the paper's rule for this request: yes when p > tau, tau in (0, 1) (default: the model's budget)")
K = Field(None, ge=1, description="the budget for this request: at most k active questions per text, 1 <= k <= m (default: the model's budget)")


# --------------------------------------------------------------------------------------------- native API


class EmbedRequest(Strict):
    """POST /embed: texts -> their active questions (sparse: indices and values; bits: 0/1 over all m), or
    probabilities, or packed bits."""

    texts: list[str] = Field(..., min_length=1, description="the texts to embed")
    output: Literal["bits", "probs", "sparse"] = Field(
        "bits", description="bits: 0/1 over the m questions, 1 for the active ones (the model's budget); sparse: the active "
                            "questions' indices and values; probs: p_i = sigma(C_i(Enc(t))), dense and unbudgeted")
    tau: float | None = Tau
    k: int | None = K
    packed: bool = Field(False, description="bits only: each vector as base64 of np.packbits (ceil(m/8) bytes)")

    @model_validator(mode="after")
    def _checks(self) -> EmbedRequest:
        if self.packed and self.output != "bits":
            raise ValueError("packed applies to output 'bits' only")
        if self.tau is not None and self.k is not None:
            raise ValueError("give tau (the paper's rule) or k (top-k), not both")
        if self.output == "probs" and (self.tau is not None or self.k is not None):
            raise ValueError("output 'probs' is every probability, unbudgeted: tau and k choose the active questions of bits and sparse")
        return self


class EmbedResponse(BaseModel):
    model: str
    m: int
    tau: float = ModelTau
    budget: str = Field(description="the rule that chose the active questions, e.g. top64>0.5 centred (output probs: none)")
    output: Literal["bits", "probs", "sparse"]
    packed: bool
    embeddings: list[str] | list[list[int]] | list[list[float]] | None = Field(None, description="bits, packed bits or probabilities")
    indices: list[list[int]] | None = Field(None, description="sparse: the active questions of each text, most confident first")
    values: list[list[float]] | None = Field(None, description="sparse: their values, in the same order")


class ExplainRequest(Strict):
    """POST /explain: why two texts are (dis)similar."""

    text_a: str
    text_b: str
    tau: float | None = Tau
    k: int | None = K

    @model_validator(mode="after")
    def _one_rule(self) -> ExplainRequest:
        if self.tau is not None and self.k is not None:
            raise ValueError("give tau (the paper's rule) or k (top-k), not both")
        return self


class QuestionAnswer(BaseModel):
    index: int = Field(description="dimension i")
    id: str
    text: str
    p_a: float = Field(description="probability of yes for text A")
    p_b: float
    a: bool = Field(description="the question is active for text A (the budget)")
    b: bool
    precision: float | None = Field(None, description="how often the question's head said yes when the labelling LLM did too, on "
                                    "held-out texts (null: too few held-out labels to measure, or a model without the figures)")
    n_heldout: int | None = Field(None, description="held-out labels behind precision (null: the model stores no figures)")


class ExplainResponse(BaseModel):
    cosine: float = Field(description="cosine of the two budgeted vectors (for 0/1 values |a AND b| / sqrt(|a| |b|))")
    cognitive_load: int = Field(description="number of questions active for both texts")
    budget: str = Field(description="the rule that chose the active questions")
    m: int
    yes_a: int
    yes_b: int
    shared_yes: list[QuestionAnswer]
    only_a: list[QuestionAnswer]
    only_b: list[QuestionAnswer]


class QuestionInfo(BaseModel):
    index: int
    id: str
    text: str
    yes_rate: float | None = Field(description="fraction of texts answering yes (see yes_rate_source)")
    precision: float | None = Field(None, description="the head's precision against the labelling LLM on held-out texts (null: unmeasured)")
    recall: float | None = Field(None, description="the head's recall against the labelling LLM on held-out texts (null: unmeasured)")
    n_heldout: int | None = Field(None, description="held-out labels behind precision and recall (null: the model stores no figures)")


class QuestionsResponse(BaseModel):
    model: str
    m: int
    tau: float = ModelTau
    budget: str = Field(description="the model's budget: which questions are active per text")
    yes_rate_source: Literal["model", "served"] = Field(
        description="model: the yes_rate field of the model's questions.json; served: the texts this replica has embedded")
    texts_seen: int
    questions: list[QuestionInfo]


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    model: str
    m: int
    tau: float = ModelTau
    budget: str = Field(description="the model's budget: which questions are active per text")
    texts_seen: int = Field(description="texts this replica has embedded")
    batches: int = Field(description="encoder calls this replica has made (texts_seen / batches = mean batch size)")


# --------------------------------------------------------------------------------------------- OpenAI embeddings


class EmbeddingsRequest(BaseModel):
    """POST /v1/embeddings, OpenAI's schema. The embedding is the model's budgeted vector, densified (its active
    questions' values, zeros elsewhere), so the cosine that OpenAI tools compute on it is the model's own similarity.
    Token-array inputs are refused (send text)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    input: str | list[str]
    model: str
    encoding_format: Literal["float", "base64"] | None = "float"  # null (a client sending every field): float
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _text_input(cls, x):
        """A string or a list of strings, else one message naming what came (not pydantic's one per union member,
        whose `input.str` and `input.list[str]` are no field of the request); token ids are refused."""
        if isinstance(x, str):
            return x
        if not isinstance(x, list):
            raise ValueError(f"must be a string or a list of strings, got a JSON {json_type(x)}")
        if x and all(isinstance(t, int) or (isinstance(t, list) and all(isinstance(u, int) for u in t)) for t in x):
            raise ValueError("token ids are not supported: send the text (a string or a list of strings)")
        if (bad := next((i for i, t in enumerate(x) if not isinstance(t, str)), None)) is not None:
            raise ValueError(f"item {bad} must be a string, got a JSON {json_type(x[bad])}")
        return x


class EmbeddingObject(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "cqg-ray"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
