"""What a finished generation, or a streamed piece of one, looks like on the wire, per endpoint.

Streams follow OpenAI's chunk format: chat opens with a chunk carrying the assistant role, text
follows as deltas, a chunk with the finish reason closes the choice, and a last chunk with no
choices carries ``usage`` (as ``stream_options.include_usage`` asks OpenAI to) and Goose's
statistics; then ``data: [DONE]``. With ``n`` > 1 every chunk names its choice by ``index``; the
choices' chunks interleave as they decode, and the closing usage counts every choice's tokens. With log
probabilities, each chunk carries those of the tokens whose text it carries (see :mod:`goose.serve.logprobs`),
in the endpoint's own shape.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, ClassVar

from goose.serve.job import Delta, Finished
from goose.serve.logprobs import WireLogprob
from goose.serve.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionTokensDetails,
    TokenLogprobEntry,
    TopLogprob,
    Usage,
)

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _dump(body: ChatCompletion | ChatCompletionChunk | Completion) -> dict[str, Any]:
    # like OpenAI's chunks with include_usage: "usage" is null until the last one; "goose" only appears there,
    # and "goose_choices" only with n > 1
    return body.model_dump(exclude={name for name in ("goose", "goose_choices") if getattr(body, name) is None})


def usage(finished: list[Finished]) -> Usage:
    """The request's usage: its prompt once, the tokens of every choice."""
    completion = sum(choice.completion_tokens for choice in finished)
    details = CompletionTokensDetails(
        accepted_prediction_tokens=sum(choice.stats.accepted_prediction_tokens for choice in finished),
        rejected_prediction_tokens=sum(choice.stats.rejected_prediction_tokens for choice in finished))
    return Usage(prompt_tokens=finished[0].prompt_tokens, completion_tokens=completion,
                 total_tokens=finished[0].prompt_tokens + completion, completion_tokens_details=details)


def _statistics(finished: list[Finished]) -> dict[str, Any]:
    """``goose`` (choice 0's statistics) and, with several choices, ``goose_choices`` (each one's)."""
    return {"goose": finished[0].stats, "goose_choices": [choice.stats for choice in finished]
            if len(finished) > 1 else None}


def chat_logprobs(entries: list[WireLogprob] | None) -> ChatLogprobs | None:
    """OpenAI chat's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}, ...]}``."""
    if entries is None:
        return None
    return ChatLogprobs(content=[
        TokenLogprobEntry(token=entry.text.token, logprob=entry.logprob, bytes=entry.text.bytes,
                          top_logprobs=[TopLogprob(token=alternative.text.token, logprob=alternative.logprob,
                                                   bytes=alternative.text.bytes) for alternative in entry.top])
        for entry in entries])


def completion_logprobs(entries: list[WireLogprob] | None) -> CompletionLogprobs | None:
    """OpenAI completions' ``logprobs``: parallel lists; each top dict also holds the chosen token (as OpenAI's:
    up to k + 1 items)."""
    if entries is None:
        return None
    return CompletionLogprobs(
        tokens=[entry.text.token for entry in entries], token_logprobs=[entry.logprob for entry in entries],
        top_logprobs=[{**{alternative.text.token: alternative.logprob for alternative in entry.top},
                       entry.text.token: entry.logprob} for entry in entries],
        text_offset=[entry.offset for entry in entries])


class _Format:
    """One answer on the wire: the whole of it, or its chunks, all under one id, creation time and model."""

    prefix: ClassVar[str]  # of the id
    whole: ClassVar[type[ChatCompletion | Completion]]
    chunk: ClassVar[type[ChatCompletionChunk | Completion]]

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _choice(self, index: int, choice: Finished) -> ChatChoice | CompletionChoice:
        raise NotImplementedError

    def response(self, finished: list[Finished]) -> dict[str, Any]:
        """The whole answer: one choice per finished generation, in choice order."""
        return _dump(self.whole(id=self.id, created=self.created, model=self.model,
                                choices=[self._choice(index, choice) for index, choice in enumerate(finished)],
                                usage=usage(finished), **_statistics(finished)))

    def totals(self, finished: list[Finished]) -> str:
        """The last chunk: no choice, the usage of all and Goose's statistics."""
        return self._chunk([], usage=usage(finished), **_statistics(finished))

    def _chunk(self, choices: list[Any], **extra: Any) -> str:
        return sse(_dump(self.chunk(id=self.id, created=self.created, model=self.model, choices=choices, **extra)))


class ChatFormat(_Format):
    """/v1/chat/completions: ``chat.completion`` and ``chat.completion.chunk`` objects."""

    prefix, whole, chunk = "chatcmpl", ChatCompletion, ChatCompletionChunk

    def _choice(self, index: int, choice: Finished) -> ChatChoice:
        return ChatChoice(index=index, message=AssistantMessage(content=choice.text),
                          logprobs=chat_logprobs(choice.logprobs), finish_reason=choice.finish_reason)

    def opening(self, choices: int = 1) -> list[str]:
        return [self._chunk([ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""))])
                for index in range(choices)]

    def delta(self, delta: Delta, index: int = 0) -> str:
        return self._chunk([ChatChunkChoice(index=index, delta=ChatDelta(content=delta.text),
                                            logprobs=chat_logprobs(delta.logprobs))])

    def finish(self, finished: Finished, index: int = 0) -> str:
        return self._chunk([ChatChunkChoice(index=index, delta=ChatDelta(), finish_reason=finished.finish_reason)])


class CompletionFormat(_Format):
    """/v1/completions: ``text_completion`` objects, whole or as chunks."""

    prefix, whole, chunk = "cmpl", Completion, Completion

    def _choice(self, index: int, choice: Finished) -> CompletionChoice:
        return CompletionChoice(index=index, text=choice.text, logprobs=completion_logprobs(choice.logprobs),
                                finish_reason=choice.finish_reason)

    def opening(self, choices: int = 1) -> list[str]:
        return []

    def delta(self, delta: Delta, index: int = 0) -> str:
        return self._chunk([CompletionChoice(index=index, text=delta.text,
                                             logprobs=completion_logprobs(delta.logprobs), finish_reason=None)])

    def finish(self, finished: Finished, index: int = 0) -> str:
        return self._chunk([CompletionChoice(index=index, text="", finish_reason=finished.finish_reason)])
