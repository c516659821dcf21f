"""The OpenAI wire format: request bodies (validated strictly) and the responses and stream chunks Goose sends.

Requests are strict: a string where a number belongs, an unknown field or a bad value is a 400 naming the field.
``prediction`` (OpenAI's Predicted Outputs) is honoured on both endpoints: its text becomes the request's most
trusted draft source, and the output is the same with it or without it. ``response_format`` (structured outputs:
``json_object`` or ``json_schema``) is honoured on both endpoints too: the output follows the schema's grammar, token
for token what constrained autoregressive decoding gives. Log probabilities are honoured as OpenAI defines them
per endpoint (chat: ``logprobs: true`` and ``top_logprobs`` 0-20; completions: ``logprobs`` 0-5). ``n`` choices
decode as rows of one batch. OpenAI options Goose does not implement (``tools``, penalties, ...) are accepted only
at their default values, so a client that sends ``tools: []`` works and one that asks for more is told no. Goose's
own options (``sources``, ``topology``, ``budget``) and vLLM's ``top_k`` and ``ignore_eos`` are extra top-level
fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from goose.cycle.logprobs import MAX_TOP_LOGPROBS

# OpenAI options Goose does not implement: the values that mean "not asked for", and what to tell a client
# that asks for more. null (or leaving the field out) is always fine.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((1,), "best_of is not supported: it must be 1"),
    "echo": ((False,), "echo is not supported"),
    "suffix": (("",), "suffix (insertion) is not supported"),
    "logit_bias": (({},), "logit_bias is not supported"),
    "presence_penalty": ((0, 0.0), "presence_penalty is not supported: it must be 0"),
    "frequency_penalty": ((0, 0.0), "frequency_penalty is not supported: it must be 0"),
    "tools": (([],), "tool calling is not supported"),
    "tool_choice": (("none", "auto"), "tool calling is not supported"),
    "functions": (([],), "function calling is not supported"),
    "function_call": (("none", "auto"), "function calling is not supported"),
    "parallel_tool_calls": ((True, False), "tool calling is not supported"),
    "modalities": ((["text"],), "only text output is supported"),
    "audio": ((), "audio output is not supported"),
    "store": ((False,), "stored completions are not supported"),
}

StopSequence = Annotated[str, Field(min_length=1, max_length=256)]
MAX_CHOICES = 16  # n at most: the choices of one request queue together
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit on the completions endpoint's logprobs


def _is_default(value: Any, allowed: tuple[Any, ...]) -> bool:
    # compare types too: JSON true must not pass for n == 1
    return value is None or any(type(value) is type(default) and value == default for default in allowed)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = Field(default=None, description="accepted; the last chunk always carries usage")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


def _joined(content: str | list[TextPart]) -> str:
    """A content field's text: the string itself, or its text parts joined."""
    return content if isinstance(content, str) else "".join(part.text for part in content)


class Prediction(_Strict):
    """OpenAI's Predicted Outputs: text the output is expected to repeat (a file being edited, a draft)."""

    type: Literal["content"] = Field(description="\"content\", the only type OpenAI defines")
    content: str | Annotated[list[TextPart], Field(min_length=1)] = Field(
        description="the predicted output: text, or a list of text parts")

    @property
    def text(self) -> str:
        return _joined(self.content)

    @field_validator("content", mode="after")
    @classmethod
    def _not_empty(cls, content: str | list[TextPart]) -> str | list[TextPart]:
        if not _joined(content):
            raise ValueError("the prediction is empty: give the expected output's text, or no prediction")
        return content


class ResponseFormatText(_Strict):
    type: Literal["text"] = Field(description="free text (the default)")


class ResponseFormatJsonObject(_Strict):
    type: Literal["json_object"] = Field(description="JSON mode: the output is a JSON object")


class JsonSchemaFormat(_Strict):
    """OpenAI's ``json_schema`` body: the schema the output must follow, and its name."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema",
                                    description="a JSON schema; {} (or leaving it out) allows any JSON")
    strict: bool | None = Field(default=None, description="accepted: the output always follows the schema exactly")


class ResponseFormatJsonSchema(_Strict):
    type: Literal["json_schema"] = Field(description="structured outputs: JSON that follows json_schema.schema")
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
                           Field(discriminator="type")]


class GenerationRequest(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = Field(default=None, description="any name: the server has one model and names it back")
    max_tokens: int | None = Field(default=None, ge=1, description="tokens to generate at most")
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=16)] | None = Field(
        default=None, description="text that ends the output (not included); up to 16 strings")
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False,
                                      description="0 (the default here): greedy decoding, token-exact")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=0, description="Goose extra: keep the k most likely tokens")
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    user: str | None = Field(default=None, description="accepted and ignored")
    metadata: dict[str, str] | None = Field(default=None, description="accepted and ignored")
    # Goose options, per request
    sources: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = Field(
        default=None, description="Goose extra: candidate sources, e.g. [\"context_match\"]")
    topology: str | None = Field(default=None, min_length=1, description="Goose extra: draft-tree planner")
    budget: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        default=None, description="Goose extra: draft-tree node budget or \"auto\"")
    ignore_eos: bool = Field(default=False, description="extra (as in vLLM): generate max_tokens tokens, past EOS")
    prediction: Prediction | None = Field(
        default=None, description="Predicted Outputs: the expected output, drafted from; the output is unchanged")
    response_format: ResponseFormat | None = Field(
        default=None, description="structured outputs: {\"type\": \"json_object\"} or {\"type\": \"json_schema\", ...}")
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES,
                          description=f"choices to generate (1..{MAX_CHOICES}); sampled, each draws with its own seed "
                          "derived from the request's (choice 0 keeps it); greedy, every choice is the one output")
    # OpenAI options Goose does not implement: accepted at their defaults only
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None

    @field_validator(*UNSUPPORTED, mode="after", check_fields=False)
    @classmethod
    def _only_defaults(cls, value: Any, info: ValidationInfo) -> Any:
        allowed, reason = UNSUPPORTED[info.field_name]
        if not _is_default(value, allowed):
            raise ValueError(reason)
        return value

    def structured_output(self) -> dict[str, Any]:
        """The decoder's options for ``response_format``: ``json_schema`` or ``json_object``, or none for text."""
        response_format = self.response_format
        if isinstance(response_format, ResponseFormatJsonObject):
            return {"json_object": True}
        if isinstance(response_format, ResponseFormatJsonSchema):
            return {"json_schema": response_format.json_schema.schema_}
        return {}

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(GenerationRequest):
    """POST /v1/completions: raw text (no chat template) or token ids."""

    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[
        list[Annotated[int, Field(ge=0)]], Field(min_length=1)] = Field(
        description="the text to continue (one string, or a list holding one string), or its token ids")
    max_tokens: int | None = Field(default=16, ge=1, description="tokens to generate at most (OpenAI's default: 16)")
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS, description=(
        "the log probability of every output token and of its k most likely alternatives (0-5); null: none"))
    best_of: Any = None
    echo: Any = None
    suffix: Any = None

    @property
    def token_limit(self) -> tuple[int | None, str]:
        """The tokens asked for at most, and the field that asked."""
        return self.max_tokens, "max_tokens"

    @property
    def top_alternatives(self) -> int | None:
        """The alternatives to report per token: None without ``logprobs``."""
        return self.logprobs


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] = Field(description="text, or a list of text parts")
    name: str | None = Field(default=None, description="accepted; chat templates ignore it")

    @property
    def text(self) -> str:
        return _joined(self.content)


class ChatCompletionRequest(GenerationRequest):
    """POST /v1/chat/completions: messages rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, description="the newer name of max_tokens")
    logprobs: bool | None = Field(default=None, description="true: the log probability of every output token")
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, description=(
        "with logprobs: also each position's k most likely tokens (0-20)"))
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    modalities: Any = None
    audio: Any = None
    store: Any = None

    @field_validator("top_logprobs", mode="after")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        # (a logprobs that failed its own check is not in info.data: its own error names it)
        if value is not None and "logprobs" in info.data and info.data["logprobs"] is not True:
            raise ValueError("logprobs must be true to use top_logprobs (as in OpenAI's API)")
        return value

    @property
    def token_limit(self) -> tuple[int | None, str]:
        """The tokens asked for at most, and the field that asked (the newer name wins)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    @property
    def top_alternatives(self) -> int | None:
        """The alternatives to report per token: None without ``logprobs: true``."""
        return (self.top_logprobs or 0) if self.logprobs else None


# --- responses ----------------------------------------------------------------------------------


class CompletionTokensDetails(BaseModel):
    """OpenAI's breakdown of the completion tokens; Goose fills in the Predicted Outputs counters."""

    accepted_prediction_tokens: int = Field(
        description="prediction tokens the target checked and kept: in the output where the prediction had them")
    rejected_prediction_tokens: int = Field(
        description="prediction tokens the target checked and refused (verified for nothing)")
    reasoning_tokens: int = 0
    audio_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None


class PluginFault(BaseModel):
    """A plugin whose hooks raised or answered malformed while serving the request: skipped, so the output is unchanged
    but its drafts were lost (the server's log has the first fault of each hook)."""

    kind: str = Field(description="source or topology")
    count: int = Field(description="its faults during this request")
    first: str = Field(description="the first one, as '<hook>: <problem>'")


class GooseStats(BaseModel):
    """The request's Goose statistics (the extra ``goose`` field of every response and of the last chunk)."""

    sources: list[str]
    topology: str
    budget: int | str
    tau: float = Field(description="tokens per verify step, the bonus token included")
    verify_steps: int
    new_tokens: int
    tokens_per_s: float = Field(description="decoding speed of this request (queue wait and prefill excluded)")
    wall_s: float
    prefill_s: float
    queue_s: float = Field(description="seconds the request waited for the model")
    mean_tree_size: float
    source_acceptance: dict[str, float] = Field(description="per source: accepted / tested draft tokens")
    source_tested: dict[str, int]
    source_accepted: dict[str, int]
    path_kinds: dict[str, int]
    accepted_prediction_tokens: int = Field(default=0, description="Predicted Outputs: prediction tokens kept")
    rejected_prediction_tokens: int = Field(default=0, description="Predicted Outputs: prediction tokens refused")
    seed: int | None = Field(default=None, description="the seed a sampled request used")
    partial: bool = Field(default=False, description="true when only token and step counts could be measured")
    faults: dict[str, PluginFault] = Field(default_factory=dict, description=(
        "per plugin that faulted while serving the request (empty when none): kind, count and first fault"))
    grammar_cut_tokens: int | None = Field(
        default=None, description="response_format: drafted tokens the grammar forbade, cut before verification")
    grammar_s: float | None = Field(default=None, description="response_format: seconds spent in the grammar")

    @model_serializer(mode="wrap")
    def _grammar_when_constrained(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # the grammar's counters appear on structured outputs only
        return {key: value for key, value in handler(self).items()
                if value is not None or key not in ("grammar_cut_tokens", "grammar_s")}


class CompletionLogprobs(BaseModel):
    """The completions endpoint's log probabilities: parallel lists, one item per output token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] = Field(
        description="per token: its k most likely alternatives and the token itself -> log probability")
    text_offset: list[int] = Field(description="where each token's text starts in the completion's text")


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None


Choice = TypeVar("Choice", bound=BaseModel)


class _Envelope(BaseModel, Generic[Choice]):
    """Every completion object and chunk: who it is, its choices, then the totals (a chunk holds them only at the
    end of the stream: ``usage`` null before, ``goose`` and ``goose_choices`` left out)."""

    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[Choice]
    usage: Usage | None = None
    goose: GooseStats | None = None
    goose_choices: Annotated[list[GooseStats] | None, Field(
        description="with n > 1: every choice's statistics, in choice order (``goose`` is choice 0's)")] = None


class Completion(_Envelope[CompletionChoice]):
    object: Literal["text_completion"] = "text_completion"


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str = Field(description="the token's text; bytes:\\xNN... for part of a character")
    logprob: float
    bytes: list[int] | None = Field(description="the token's UTF-8 bytes")


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(description="the position's k most likely tokens, best first")


class ChatLogprobs(BaseModel):
    """The chat endpoint's log probabilities: one entry per output token."""

    content: list[TokenLogprobEntry] | None
    refusal: list[TokenLogprobEntry] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"]


class ChatCompletion(_Envelope[ChatChoice]):
    object: Literal["chat.completion"] = "chat.completion"
    usage: Usage
    goose: GooseStats


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # OpenAI's deltas name only what they carry: {"content": "..."}, and {} in the closing chunk
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(_Envelope[ChatChunkChoice]):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "goose"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
