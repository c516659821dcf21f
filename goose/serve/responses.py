"""What a finished generation, or a streamed piece of one, looks like on the wire, per endpoint.

Streams follow OpenAI's chunk format: chat opens with a chunk carrying the assistant role, text
follows as deltas, a chunk with the finish reason closes the choice, and a last chunk with no
choices carries ``usage`` (as ``stream_options.include_usage`` asks OpenAI to) and Goose's
statistics; then ``data: [DONE]``. With log probabilities, each chunk carries those of the tokens whose
text it carries (see :mod:`goose.serve.logprobs`), in the endpoint's own shape.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from goose.serve.engine import Delta, Finished
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


def _dump(chunk: ChatCompletionChunk | Completion) -> dict[str, Any]:
    # like OpenAI's chunks with include_usage: "usage" is null until the last one; "goose" only appears there
    return chunk.model_dump(exclude={"goose"} if chunk.goose is None else None)


def usage(finished: Finished) -> Usage:
    details = CompletionTokensDetails(accepted_prediction_tokens=finished.stats.accepted_prediction_tokens,
                                      rejected_prediction_tokens=finished.stats.rejected_prediction_tokens)
    return Usage(prompt_tokens=finished.prompt_tokens, completion_tokens=finished.completion_tokens,
                 total_tokens=finished.prompt_tokens + finished.completion_tokens, completion_tokens_details=details)


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


class ChatFormat:
    """/v1/chat/completions: ``chat.completion`` and ``chat.completion.chunk`` objects."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def response(self, finished: Finished) -> dict[str, Any]:
        return ChatCompletion(
            id=self.id, created=self.created, model=self.model,
            choices=[ChatChoice(message=AssistantMessage(content=finished.text),
                                logprobs=chat_logprobs(finished.logprobs), finish_reason=finished.finish_reason)],
            usage=usage(finished), goose=finished.stats,
        ).model_dump()

    def opening(self) -> list[str]:
        return [self._chunk([ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))])]

    def delta(self, delta: Delta) -> str:
        return self._chunk([ChatChunkChoice(delta=ChatDelta(content=delta.text),
                                            logprobs=chat_logprobs(delta.logprobs))])

    def closing(self, finished: Finished) -> list[str]:
        return [self._chunk([ChatChunkChoice(delta=ChatDelta(), finish_reason=finished.finish_reason)]),
                self._chunk([], usage=usage(finished), goose=finished.stats)]

    def _chunk(self, choices: list[ChatChunkChoice], **extra: Any) -> str:
        return sse(_dump(ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices,
                                             **extra)))


class CompletionFormat:
    """/v1/completions: ``text_completion`` objects, whole or as chunks."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = f"cmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def response(self, finished: Finished) -> dict[str, Any]:
        choice = CompletionChoice(text=finished.text, logprobs=completion_logprobs(finished.logprobs),
                                  finish_reason=finished.finish_reason)
        return self._completion([choice], usage=usage(finished), goose=finished.stats).model_dump()

    def opening(self) -> list[str]:
        return []

    def delta(self, delta: Delta) -> str:
        choice = CompletionChoice(text=delta.text, logprobs=completion_logprobs(delta.logprobs), finish_reason=None)
        return sse(_dump(self._completion([choice])))

    def closing(self, finished: Finished) -> list[str]:
        end = self._completion([CompletionChoice(text="", finish_reason=finished.finish_reason)])
        totals = self._completion([], usage=usage(finished), goose=finished.stats)
        return [sse(_dump(end)), sse(_dump(totals))]

    def _completion(self, choices: list[CompletionChoice], **extra: Any) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, **extra)
